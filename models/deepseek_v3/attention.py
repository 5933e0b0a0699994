"""Multi-head latent attention (DeepSeek-V2/V3) and its RoPE table (YaRN-scaled as the published
config.json has it).

Per token: queries come from dim directly (`wq`, q_lora_rank 0) or through a normalized latent
(`wq_a` -> `q_norm` -> `wq_b`); keys and values come from one normalized latent of kv_lora_rank
(`wkv_a` -> `kv_norm` -> `wkv_b`), and `wkv_a` also yields one RoPE key of qk_rope_head_dim that
every head shares. A head's query and key are [nope part, rotated part] (qk_nope + qk_rope
wide); its value is v_head_dim wide, which may differ. Only the rotated parts see RoPE.

RoPE layout: titanlite rotates adjacent pairs (models/layers.py), as DeepSeek's own weights are
laid out (Hugging Face's `rope_interleave = true`): no permutation on import or export.

The shared RoPE key reaches every head through `share_rope_key`, a module of its own without
parameters, so that tensor parallel (each rank holds some heads) can sum its gradient over the
ranks (parallelisms/deepseek_v3/tensor_parallel.py). The kernel is `sdpa`, the swappable module
of models/layers.py, with the model's softmax scale.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from models.deepseek_v3.args import DeepSeekV3Args, yarn_mscale
from models.initialization import fill_trunc_normal_
from models.layers import RMSNorm, ScaledDotProductAttention, apply_rope, inverse_frequencies

LATENT_NORM_EPS = 1e-6  # DeepSeek's latent norms keep RMSNorm's default, whatever norm_eps is


def yarn_inverse_frequencies(args: DeepSeekV3Args, device: torch.device | None) -> torch.Tensor:
    """θ_k of the rotated width, YaRN-interpolated when rope_factor > 1 (Peng et al. 2023, as
    Hugging Face's `_compute_yarn_parameters` with truncate): the high frequencies (more than
    beta_fast turns over the original context) kept, the low ones (fewer than beta_slow)
    divided by the factor, a linear ramp between."""
    dim, base, factor = args.qk_rope_head_dim, args.rope_theta, args.rope_factor
    plain = inverse_frequencies(dim, base, device)
    if factor <= 1:
        return plain

    def turns_to_dim(turns: float) -> float:
        return (
            dim
            * math.log(args.rope_original_max_seq_len / (turns * 2 * math.pi))
            / (2 * math.log(base))
        )

    low: float = max(math.floor(turns_to_dim(args.rope_beta_fast)), 0)
    high: float = min(math.ceil(turns_to_dim(args.rope_beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = (
        (torch.arange(dim // 2, device=device, dtype=torch.float32) - low) / (high - low)
    ).clamp(0, 1)
    kept = 1 - ramp
    return plain / factor * (1 - kept) + plain * kept


def rope_magnitude(args: DeepSeekV3Args) -> float:
    """YaRN's scale of the rotated parts of queries and keys (Hugging Face's attention_factor):
    mscale(factor, mscale) / mscale(factor, mscale_all_dim), 1 for the published models."""
    if args.rope_factor <= 1:
        return 1.0
    if args.rope_mscale and args.rope_mscale_all_dim:
        return yarn_mscale(args.rope_factor, args.rope_mscale) / yarn_mscale(
            args.rope_factor, args.rope_mscale_all_dim
        )
    return yarn_mscale(args.rope_factor, 1.0)


def rope_table(args: DeepSeekV3Args, device: torch.device | None) -> torch.Tensor:
    """(max_seq_len, qk_rope_head_dim / 2) complex rotations, of magnitude `rope_magnitude`."""
    freqs = yarn_inverse_frequencies(args, device)
    t = torch.arange(args.max_seq_len, device=freqs.device, dtype=torch.float32)
    angles = torch.outer(t, freqs)
    return torch.polar(torch.full_like(angles, rope_magnitude(args)), angles)


class ShareRopeKey(nn.Module):
    """(batch, seq, 1, rope) -> (batch, seq, heads, rope): the one rotated key, for each head."""

    def forward(self, k_rope: torch.Tensor, heads: int) -> torch.Tensor:
        return k_rope.expand(-1, -1, heads, -1)


class MultiHeadLatentAttention(nn.Module):
    def __init__(self, args: DeepSeekV3Args):
        super().__init__()
        d, n = args.dim, args.n_heads
        self.nope, self.rope, self.v_dim = (
            args.qk_nope_head_dim,
            args.qk_rope_head_dim,
            args.v_head_dim,
        )
        self.kv_lora_rank = args.kv_lora_rank
        qk = args.qk_head_dim
        self.wq: nn.Linear | None = None
        self.wq_a: nn.Linear | None = None
        self.q_norm: RMSNorm | None = None
        self.wq_b: nn.Linear | None = None
        if args.q_lora_rank:
            self.wq_a = nn.Linear(d, args.q_lora_rank, bias=False)
            self.q_norm = RMSNorm(args.q_lora_rank, LATENT_NORM_EPS)
            self.wq_b = nn.Linear(args.q_lora_rank, n * qk, bias=False)
        else:
            self.wq = nn.Linear(d, n * qk, bias=False)
        self.wkv_a = nn.Linear(d, args.kv_lora_rank + self.rope, bias=False)
        self.kv_norm = RMSNorm(args.kv_lora_rank, LATENT_NORM_EPS)
        self.wkv_b = nn.Linear(args.kv_lora_rank, n * (self.nope + self.v_dim), bias=False)
        self.wo = nn.Linear(n * self.v_dim, d, bias=False)
        self.share_rope_key = ShareRopeKey()
        self.sdpa = ScaledDotProductAttention(args.softmax_scale)

    def queries(self, x: torch.Tensor) -> torch.Tensor:
        if self.wq is not None:
            return self.wq(x)
        assert self.wq_a is not None and self.q_norm is not None and self.wq_b is not None
        return self.wq_b(self.q_norm(self.wq_a(x)))

    def forward(self, x: torch.Tensor, freqs: torch.Tensor, mask=None) -> torch.Tensor:
        bs, seq, _ = x.shape
        q = self.queries(x).view(bs, seq, -1, self.nope + self.rope)
        q_nope, q_rope = q.split([self.nope, self.rope], dim=-1)
        latent, k_rope = self.wkv_a(x).split([self.kv_lora_rank, self.rope], dim=-1)
        q_rope, k_rope = apply_rope(q_rope, k_rope.unsqueeze(2), freqs)
        kv = self.wkv_b(self.kv_norm(latent)).view(bs, seq, -1, self.nope + self.v_dim)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        heads = kv.shape[2]
        q = torch.cat([q_nope, q_rope], dim=-1)
        k = torch.cat([k_nope, self.share_rope_key(k_rope, heads)], dim=-1)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (batch, heads, seq, width)
        out = self.sdpa(q, k, v, mask)
        return self.wo(out.transpose(1, 2).reshape(bs, seq, -1))

    def init_weights(self, key: str, seed: int, out_std: float) -> None:
        for name in ("wq", "wq_a", "wq_b", "wkv_a", "wkv_b"):
            linear = getattr(self, name)
            if linear is not None:
                fill_trunc_normal_(linear.weight, 0.02, seed, f"{key}.{name}")
        fill_trunc_normal_(self.wo.weight, out_std, seed, f"{key}.wo")
        for norm in (self.q_norm, self.kv_norm):
            if norm is not None:
                norm.init_weights()
