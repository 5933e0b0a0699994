"""Tensor parallel for a Mixture-of-Experts feed-forward (models/moe.py): token-wise, replicated.

Under sequence parallel the MoE's input is this tp rank's sequence shard. The MoE is token-wise,
so each tp rank routes and computes its own tokens with the whole router, experts and shared
experts, REPLICATED over the tp mesh, and its output stays sequence-sharded: no collective in the
forward but the auxiliary loss's (below), nothing to all-gather or reduce-scatter.

Gradients. The replicated parameters are DTensors (Replicate) on the tp mesh, like the norms'
weights, so FSDP shards them over the data-parallel mesh as it does any 2-D parameter. During the
MoE's forward each is swapped for its local tensor through `SumGradOverGroup`: identity forward, and a
backward that all-reduces the gradient over tp, since each tp rank saw other tokens (q/k norms in
parallelisms/decoder_tp.py get the same sum from DTensor itself).

Load statistics. Each tp rank counts its own tokens per expert; the trainer sums them over tp as
well as over data and context parallel (Trainer.expert_load_sum), so the expert bias moves the
same on every rank.

The per-sequence auxiliary loss needs each sequence's whole statistics: they are completed over
the tp ranks (parallelisms/moe_sequences.py).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

from models.moe import MoE
from parallelisms.local_params import SumGradOverGroup, compute_on_local_params
from parallelisms.moe_sequences import complete_sequences_over


def apply_moe_tp(moe: MoE, tp_mesh: DeviceMesh) -> None:
    """Make `moe` token-wise tensor parallel on `tp_mesh` (its input: the local sequence shard,
    or a DTensor sharded on the sequence, which it takes locally; its output: the local shard).
    Parameters already distributed (experts split by expert parallel) are left to their layout."""
    group = tp_mesh.get_group()
    replicated: list[tuple[nn.Module, str]] = []
    for module in moe.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if isinstance(param, DTensor):
                continue
            local = distribute_tensor(param.data, tp_mesh, [Replicate()])
            module.register_parameter(name, nn.Parameter(local, param.requires_grad))
            replicated.append((module, name))
    complete_sequences_over(moe, group, grads_summed=True)
    compute_on_local_params(
        moe, replicated, lambda param: SumGradOverGroup.apply(param.to_local(), group)
    )
