"""Llama 3, written to read like the paper: RMSNorm, RoPE (with Llama 3.1 frequency scaling),
grouped-query attention through scaled_dot_product_attention, SwiGLU, an untied output head.

Nothing here knows about parallelism. Tensor parallel relies only on two habits: head counts are
inferred from the projected width (`view(..., -1, head_dim)`), so column-sharded projections
work unchanged, and every sub-module has a stable name (`attention.wq`, `feed_forward.w1`, ...).
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from models.initialization import fill_trunc_normal_
from models.llama.args import LlamaArgs


def rope_frequencies(
    args: LlamaArgs, seq_len: int, device: torch.device | None = None
) -> torch.Tensor:
    """Complex rotations e^{i·t·θ_k} for positions t < seq_len, shape (seq_len, head_dim/2)."""
    dim = args.head_dim
    freqs = 1.0 / (args.rope_theta ** (torch.arange(0, dim, 2, device=device).float() / dim))
    if args.rope_scaling is not None:
        freqs = _llama31_scale(freqs, *args.rope_scaling)
    t = torch.arange(seq_len, device=device, dtype=torch.float32)
    angles = torch.outer(t, freqs)
    return torch.polar(torch.ones_like(angles), angles)


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


def apply_rope(
    xq: torch.Tensor, xk: torch.Tensor, freqs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate (batch, seq, heads, head_dim) queries and keys by position; `freqs` may cover
    more positions than seq (the model passes its whole table: under sequence parallel the
    block input is sharded on seq, so only the attention knows the full length)."""

    def rotate(x: torch.Tensor) -> torch.Tensor:
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        out = torch.view_as_real(xc * freqs[None, : x.shape[1], None, :]).flatten(3)
        return out.type_as(x)

    return rotate(xq), rotate(xk)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).type_as(x)

    def init_weights(self) -> None:
        nn.init.ones_(self.weight)


class Attention(nn.Module):
    def __init__(self, args: LlamaArgs):
        super().__init__()
        self.head_dim = args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        bs, seq, _ = x.shape
        q = self.wq(x).view(bs, seq, -1, self.head_dim)
        k = self.wk(x).view(bs, seq, -1, self.head_dim)
        v = self.wv(x).view(bs, seq, -1, self.head_dim)
        q, k = apply_rope(q, k, freqs)
        # (batch, heads, seq, head_dim); SDPA repeats the shared key/value heads for GQA.
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1]
        )
        return self.wo(out.transpose(1, 2).reshape(bs, seq, -1))

    def init_weights(self, key: str, seed: int, out_std: float) -> None:
        for name in ("wq", "wk", "wv"):
            fill_trunc_normal_(getattr(self, name).weight, 0.02, seed, f"{key}.{name}")
        fill_trunc_normal_(self.wo.weight, out_std, seed, f"{key}.wo")


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def init_weights(self, key: str, seed: int, out_std: float) -> None:
        fill_trunc_normal_(self.w1.weight, 0.02, seed, f"{key}.w1")
        for name in ("w2", "w3"):
            fill_trunc_normal_(getattr(self, name).weight, out_std, seed, f"{key}.{name}")


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: LlamaArgs):
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args.dim, args.ffn_hidden_dim)
        depth = layer_id + 1 if args.depth_init else args.n_layers
        self.out_std = 0.02 / (2 * depth) ** 0.5

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs)
        return h + self.feed_forward(self.ffn_norm(h))

    def init_weights(self, key: str, seed: int) -> None:
        self.attention_norm.init_weights()
        self.ffn_norm.init_weights()
        self.attention.init_weights(f"{key}.attention", seed, self.out_std)
        self.feed_forward.init_weights(f"{key}.feed_forward", seed, self.out_std)


class Transformer(nn.Module):
    freqs_cis: torch.Tensor

    def __init__(self, args: LlamaArgs):
        super().__init__()
        args.check()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        # A dict keyed by the layer number keeps checkpoint keys stable if layers are dropped
        # or moved (as pipeline stages do).
        self.layers = nn.ModuleDict(
            {str(i): TransformerBlock(i, args) for i in range(args.n_layers)}
        )
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        # Not persistent: derived from args, so checkpoints need not carry it.
        self.register_buffer(
            "freqs_cis", rope_frequencies(args, args.max_seq_len), persistent=False
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.freqs_cis)
        return self.output(self.norm(h))

    @torch.no_grad()
    def init_weights(self, seed: int, buffer_device: torch.device | None = None) -> None:
        """Fill every parameter from (seed, parameter name, element index) alone, so the full
        weights are the same whatever the device, dtype of the run or parallel layout."""
        device = buffer_device or self.freqs_cis.device
        self.freqs_cis = rope_frequencies(self.args, self.args.max_seq_len, device)
        fill_trunc_normal_(self.tok_embeddings.weight, 1.0, seed, "tok_embeddings", cutoff=None)
        for i, layer in self.layers.items():
            cast(TransformerBlock, layer).init_weights(f"layers.{i}", seed)
        self.norm.init_weights()
        std = self.args.dim**-0.5
        fill_trunc_normal_(self.output.weight, std, seed, "output", cutoff=3 * std)
