"""The Llama TP plan: the shared decoder plan (parallelisms/decoder_tp.py), Megatron-style tensor
parallel with sequence parallel: q/k/v and w1/w3 column-wise, wo and w2 row-wise, norms on their
sequence shard, the output head column-wise (vocabulary-sharded logits with loss parallel).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from parallelisms.decoder_tp import apply_decoder_tp


def apply_tp(
    model: nn.Module,
    blocks: list[nn.Module],
    tp_mesh: DeviceMesh,
    *,
    loss_parallel_enabled: bool,
    float8_all_gather: bool = False,
) -> None:
    """Apply the plan to a Llama-structured model (tok_embeddings, layers, norm, output)."""
    apply_decoder_tp(
        model,
        blocks,
        tp_mesh,
        loss_parallel_enabled=loss_parallel_enabled,
        float8_all_gather=float8_all_gather,
    )
