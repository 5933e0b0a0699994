"""The layers every decoder family here is built from: RMSNorm, RoPE (titanlite's interleaved
layout), the swappable attention kernel module and the SwiGLU feed-forward. Nothing here knows
a family's args dataclass; each family passes plain shapes.

RoPE layout: pairs (x[2k], x[2k+1]) of each head are rotated as complex numbers (Meta's original
layout). Hugging Face rotates the halves (x[k], x[k + head_dim/2]); the families' HF adapters
permute the q/k projection rows within each head (`models.hf_common`), which gives the same q.k.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models.attention import AttentionMask, attend
from models.initialization import fill_trunc_normal_


def inverse_frequencies(
    head_dim: int, theta: float, device: torch.device | None = None
) -> torch.Tensor:
    """θ_k = theta^(-2k/head_dim), k < head_dim/2, in float32."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))


def rotations(freqs: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Complex rotations e^{i·t·θ_k} for positions t < seq_len, shape (seq_len, len(freqs))."""
    t = torch.arange(seq_len, device=freqs.device, dtype=torch.float32)
    angles = torch.outer(t, freqs)
    return torch.polar(torch.ones_like(angles), angles)


def apply_rope(
    xq: torch.Tensor, xk: torch.Tensor, freqs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate (batch, seq, heads, head_dim) queries and keys by position. `freqs` is either the
    table (positions, head_dim/2), whose first seq rows serve every sequence and which may cover
    more positions than seq (the model passes its whole table: under sequence parallel the block
    input is sharded on seq, so only the attention knows the full length), or one rotation per
    token, (batch, seq, head_dim/2), for positions that differ between sequences."""
    if freqs.ndim == 2:
        rotations = freqs[None, : xq.shape[1], None, :]
    else:
        rotations = freqs[:, :, None, :]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        out = torch.view_as_real(xc * rotations).flatten(3)
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


class ScaledDotProductAttention(nn.Module):
    """The attention kernel on (batch, heads, seq, head_dim) queries, keys and values; a module of
    its own (no parameters) so that a parallelism can swap it (context parallel gathers the keys
    and values of the whole sequence first). `scale`: the softmax scale, None for
    1/sqrt(head_dim)."""

    def __init__(self, scale: float | None = None):
        super().__init__()
        self.scale = scale

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask = None
    ) -> torch.Tensor:
        return attend(q, k, v, mask, self.scale)


class Attention(nn.Module):
    """Grouped-query attention: `n_heads` query heads of `head_dim` (which need not be
    dim / n_heads) share `kv_heads` key/value heads. With `qk_norm_eps`, queries and keys are
    RMS-normalized per head before RoPE (Qwen3, OLMo 2 style), with one weight of head_dim shared
    by all heads."""

    def __init__(
        self, dim: int, n_heads: int, kv_heads: int, head_dim: int, qk_norm_eps: float | None
    ):
        super().__init__()
        self.head_dim = head_dim
        self.wq = nn.Linear(dim, n_heads * head_dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.wo = nn.Linear(n_heads * head_dim, dim, bias=False)
        self.q_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None
        self.k_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None
        self.sdpa = ScaledDotProductAttention()

    def forward(
        self, x: torch.Tensor, freqs: torch.Tensor, mask: AttentionMask = None
    ) -> torch.Tensor:
        """`mask`: what `models.attention.attend` takes (None for causal)."""
        bs, seq, _ = x.shape
        q = self.wq(x).view(bs, seq, -1, self.head_dim)
        k = self.wk(x).view(bs, seq, -1, self.head_dim)
        v = self.wv(x).view(bs, seq, -1, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, k, freqs)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (batch, heads, seq, head_dim)
        out = self.sdpa(q, k, v, mask)
        return self.wo(out.transpose(1, 2).reshape(bs, seq, -1))

    def init_weights(self, key: str, seed: int, out_std: float) -> None:
        for name in ("wq", "wk", "wv"):
            fill_trunc_normal_(getattr(self, name).weight, 0.02, seed, f"{key}.{name}")
        fill_trunc_normal_(self.wo.weight, out_std, seed, f"{key}.wo")
        for norm in (self.q_norm, self.k_norm):
            if norm is not None:
                norm.init_weights()


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

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
