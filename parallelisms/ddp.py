"""Pure data-parallel replication (replicas > 1, no sharding): DDP, as TorchTitan does."""

from __future__ import annotations

from torch import nn
from torch.distributed._composable.replicate import replicate
from torch.distributed.device_mesh import DeviceMesh


def apply_ddp(model: nn.Module, mesh: DeviceMesh) -> None:
    # Large buckets: fewer all-reduce calls; the model is small relative to them only in tests.
    replicate(model, device_mesh=mesh, bucket_cap_mb=100)
