"""The Qwen3 TP plan: the shared decoder plan (parallelisms/decoder_tp.py) with the per-head
query/key norms, whose weight gradients are summed over the tp ranks, and, for a tied model, the
output head tied to the embedding again (both are vocabulary-sharded, Shard(0), so the one
DTensor serves both ends and collects both gradients)."""

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
    """Apply the plan to a Qwen3 model (tok_embeddings, layers, norm, output)."""
    apply_decoder_tp(
        model,
        blocks,
        tp_mesh,
        loss_parallel_enabled=loss_parallel_enabled,
        float8_all_gather=float8_all_gather,
        qk_norm=True,
    )
    tie = getattr(model, "tie_weights", None)
    if getattr(model.args, "tie_word_embeddings", False) and tie is not None:
        tie()
