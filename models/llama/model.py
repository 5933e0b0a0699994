"""Llama 3, written to read like the paper: RMSNorm, RoPE (with Llama 3.1 frequency scaling),
grouped-query attention through the kernels of `models.attention`, SwiGLU, an untied output head.
The model around the blocks (masks, RoPE positions, the forward) is `models.decoder.Decoder`,
shared with the other families; the layers are `models.layers`.
"""

from __future__ import annotations

import math

import torch

from models import layers
from models.decoder import Decoder, DecoderBlock, Positions, depth_out_std
from models.layers import FeedForward, RMSNorm, apply_rope, inverse_frequencies, rotations
from models.llama.args import LlamaArgs

__all__ = [
    "Attention",
    "FeedForward",
    "Positions",
    "RMSNorm",
    "Transformer",
    "apply_rope",
    "rope_frequencies",
]


def rope_frequencies(
    args: LlamaArgs, seq_len: int, device: torch.device | None = None
) -> torch.Tensor:
    """Complex rotations e^{i·t·θ_k} for positions t < seq_len, shape (seq_len, head_dim/2)."""
    freqs = inverse_frequencies(args.head_dim, args.rope_theta, device)
    if args.rope_scaling is not None:
        freqs = _llama31_scale(freqs, *args.rope_scaling)
    return rotations(freqs, seq_len)


def _llama31_scale(
    freqs: torch.Tensor, factor: float, low: float, high: float, ctx: int
) -> torch.Tensor:
    # Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
    wavelen = 2 * math.pi / freqs
    low_wavelen, high_wavelen = ctx / low, ctx / high
    smooth = (ctx / wavelen - low) / (high - low)
    mid = (1 - smooth) * freqs / factor + smooth * freqs
    out = torch.where(wavelen > low_wavelen, freqs / factor, freqs)
    is_mid = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
    return torch.where(is_mid, mid, out)


def Attention(args: LlamaArgs) -> layers.Attention:  # noqa: N802 (the module it builds)
    """Llama's attention: head_dim = dim / n_heads, no query/key norms."""
    return layers.Attention(args.dim, args.n_heads, args.kv_heads, args.head_dim, None)


def _block(layer_id: int, args: LlamaArgs) -> DecoderBlock:
    """A Llama block: grouped-query attention and the SwiGLU feed-forward."""
    return DecoderBlock(
        Attention(args),
        FeedForward(args.dim, args.ffn_hidden_dim),
        args.dim,
        args.norm_eps,
        depth_out_std(layer_id, args.n_layers, args.depth_init),
    )


class Transformer(Decoder):
    def __init__(self, args: LlamaArgs):
        super().__init__(args, lambda i: _block(i, args))

    def rope_table(self, device: torch.device | None) -> torch.Tensor:
        return rope_frequencies(self.args, self.args.max_seq_len, device)
