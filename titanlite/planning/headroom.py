"""The device memory a GPU rank needs beyond what the plan counts: the CUDA context and the
buffers of each NCCL communicator it belongs to. Figures from NVIDIA's and PyTorch's sources
(docs/dry_run.md gives them); none is measured here (no GPU has run titanlite).

The caching allocator's fragmentation is left out: run_train.sh turns on expandable segments
(PYTORCH_ALLOC_CONF), which grow segments in place instead of leaving fixed-size ones half
used; `memory_reserved_gib` in metrics.jsonl shows what the allocator really took."""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

MIB, GIB = 2**20, 2**30

# The CUDA context with the kernels a training step loads: 287 MB lazily loaded and 667 MB
# eagerly for PyTorch's own (pytorch/pytorch#86509); lazy loading is CUDA 12.2+'s default, and
# cuBLAS, cuDNN and NCCL add their modules and workspaces as they are used.
CUDA_CONTEXT = 1 * GIB
# Per NCCL communicator, with NCCL's defaults: each channel keeps a buffer per connected peer
# and protocol, Simple NCCL_BUFFSIZE 4 MiB, LL128 4.6875 MiB (120 bytes x 640 threads x 8
# steps x 8), LL 0.5 MiB; 32 channels (what NCCL opened between two of 8 H100s in
# NVIDIA/nccl#1685), two peers each (the ring's previous rank, the tree's parent or child):
# 588 MiB. NVIDIA/nccl#964 measured
# 544 MB (2 ranks) and 688 MB (4 ranks) per communicator on A100 NVLink after one all-reduce.
NCCL_CHANNELS = 32
NCCL_PEERS_PER_CHANNEL = 2
NCCL_PROTOCOL_BUFFERS = 4 * MIB + 4800 * 1024 + 512 * 1024  # Simple + LL128 + LL
NCCL_COMMUNICATOR = NCCL_CHANNELS * NCCL_PEERS_PER_CHANNEL * NCCL_PROTOCOL_BUFFERS


@dataclass(frozen=True)
class Headroom:
    communicators: int  # NCCL communicators with peers that this rank belongs to
    cuda_context: int

    @property
    def bytes(self) -> int:
        return self.cuda_context + self.communicators * NCCL_COMMUNICATOR

    def describe(self) -> str:
        if not self.cuda_context:
            return "headroom: none (not a CUDA launch)"
        return (
            f"headroom: CUDA context {self.cuda_context / GIB:.2f} GiB + {self.communicators} "
            f"NCCL communicator(s) x {NCCL_COMMUNICATOR / MIB:.0f} MiB (estimates, "
            "docs/dry_run.md)"
        )


def communicators() -> int:
    """Process groups of more than one rank that this rank belongs to, under the current
    (fake) process group: the default group and each mesh dim's and flattened dim's group. On
    CUDA each is an NCCL communicator of its own: titanlite binds the device at
    init_process_group, so torch creates each group's communicator eagerly (by splitting the
    default one, which shares no buffers). The checkpoint's gloo group holds none."""
    groups = dist.distributed_c10d._world.pg_map
    return sum(1 for group in groups if dist.get_world_size(group) > 1)


def headroom(device_type: str, n_communicators: int) -> Headroom:
    if device_type != "cuda":
        return Headroom(0, 0)
    return Headroom(n_communicators, CUDA_CONTEXT)
