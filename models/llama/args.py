"""Llama 3 hyper-parameters and the named flavors (the same names mean the same models as in
TorchTitan; 8B/70B/405B are the published Llama 3.1 shapes)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from models.decoder import check_attention_args


@dataclass(frozen=True)
class LlamaArgs:
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int | None = None  # None = n_heads (no grouped-query attention)
    vocab_size: int = -1  # taken from the tokenizer
    multiple_of: int = 256  # the FFN hidden size is rounded up to a multiple of this
    ffn_dim_multiplier: float | None = None
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # Llama 3.1 RoPE frequency scaling (factor, low_freq_factor, high_freq_factor, original
    # context); None disables it.
    rope_scaling: tuple[float, float, float, int] | None = (8.0, 1.0, 4.0, 8192)
    max_seq_len: int = 131072
    # Scale the init of output projections by depth (GPT-2 / TorchTitan's depth_init).
    depth_init: bool = True
    # Attention kernel and mask (TorchTitan's names). "block_causal" lets a token attend only to
    # earlier tokens of its own document; documents start at each `bos_id` in the input, and a
    # window's tokens before its first BOS (a document cut by the window start) form one more.
    attn_type: str = "sdpa"  # models.attention.ATTN_TYPES: "auto", "sdpa", "flex", "varlen"
    attn_mask_type: str = "causal"  # "causal" or "block_causal"
    # RoPE positions: "window" counts from the window start (TorchTitan); "document" restarts
    # at each document's first token. Under block_causal the two are the same function up to
    # rounding (scores depend on position differences, all within one document); across
    # documents (causal) restarting positions would scramble them, hence block_causal only.
    rope_positions: str = "window"
    # The token that starts a document (from the tokenizer); only block_causal reads it, and
    # only in forward, so that shape-only uses (a dry run, conversions) need no tokenizer.
    bos_id: int = -1

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def ffn_hidden_dim(self) -> int:
        hidden = int(2 * (4 * self.dim) / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-able data (what a checkpoint's manifest records)."""
        return {
            f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
            for f in fields(self)
        }

    @classmethod
    def from_dict(cls, d: dict) -> LlamaArgs:
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown model argument(s) {', '.join(unknown)}")
        d = dict(d)
        if d.get("rope_scaling") is not None:
            factor, low, high, ctx = d["rope_scaling"]
            d["rope_scaling"] = (float(factor), float(low), float(high), int(ctx))
        return cls(**d)

    def with_overrides(self, **overrides: Any) -> LlamaArgs:
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def check(self) -> None:
        """Shape constraints that the model itself needs; ValueError names the broken one."""
        if self.vocab_size < 1:
            raise ValueError(f"vocab_size = {self.vocab_size}: must be set (from the tokenizer)")
        if self.dim % self.n_heads:
            raise ValueError(f"dim = {self.dim} is not divisible by n_heads = {self.n_heads}")
        if self.n_heads % self.kv_heads:
            raise ValueError(
                f"n_heads = {self.n_heads} is not divisible by n_kv_heads = {self.kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim = dim / n_heads = {self.head_dim} must be even for RoPE")
        check_attention_args(self)


FLAVORS: dict[str, LlamaArgs] = {
    "debugmodel": LlamaArgs(dim=256, n_layers=6, n_heads=16, rope_theta=500000),
    "8B": LlamaArgs(
        dim=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=8,
        ffn_dim_multiplier=1.3,
        multiple_of=1024,
        rope_theta=500000,
    ),
    "70B": LlamaArgs(
        dim=8192,
        n_layers=80,
        n_heads=64,
        n_kv_heads=8,
        ffn_dim_multiplier=1.3,
        multiple_of=4096,
        rope_theta=500000,
    ),
    "405B": LlamaArgs(
        dim=16384,
        n_layers=126,
        n_heads=128,
        n_kv_heads=8,
        ffn_dim_multiplier=1.2,
        multiple_of=4096,
        rope_theta=500000,
    ),
}


def num_params(args: LlamaArgs, include_embedding: bool = True) -> int:
    """Exact parameter count, without building the model."""
    d, kv, hd = args.dim, args.kv_heads, args.head_dim
    attention = d * args.n_heads * hd * 2 + d * kv * hd * 2
    ffn = 3 * d * args.ffn_hidden_dim
    per_block = attention + ffn + 2 * d
    total = args.n_layers * per_block + d + args.vocab_size * d  # final norm + output head
    return total + (args.vocab_size * d if include_embedding else 0)


def training_flops_per_token(args: LlamaArgs, seq_len: int) -> int:
    """Forward + backward FLOPs per token: 6 x (non-embedding parameters) for the matmuls plus
    the attention scores and values (12 x layers x heads x head_dim x seq_len, as TorchTitan and
    the PaLM paper count them, without halving for the causal mask)."""
    attention = 12 * args.n_layers * args.n_heads * args.head_dim * seq_len
    return 6 * num_params(args, include_embedding=False) + attention
