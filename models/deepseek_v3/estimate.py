"""The dry run's formulas for DeepSeek-V3: the bookkeeping of models/estimate.py (what autograd
saves per token and block) redone for multi-head latent attention, with DeepSeekMoE from
`moe_terms`, and the MTP modules outside the blocks. Per token and block, compute dtype size
e, heads n over tp ranks t, widths qk = nope + rope and v, latents r_q (0: none) and r_kv:

    norms       2 x (4d/t + 4/t)            as the shared block
    gathered    e*d (+ e*d dense FFN, or    the norm outputs the projections read
                e*d/t before an MoE)
    q latent    e*r_q + 4*r_q + 4 + e*r_q   wq_a's output, q_norm's fp32 input and 1/rstd,
                                            its output (wq_b's input); none with r_q = 0
    kv latent   e*(r_kv + rope) + 4*r_kv    wkv_a's output, kv_norm's fp32 input and 1/rstd,
                + 4 + e*r_kv                its output (wkv_b's input)
    attention   e*n*(2 qk + v)/t            q, k and v (the SDPA inputs); the varlen kernel
                + 2 x e*n*v/t + 4n/t        pads v to qk (+ e*n*(qk - v)/t); SDPA's output, its
                                            contiguous copy for wo, log-sum-exp
    feed-fwd    SwiGLU 4 x e*F/t, or the MoE's terms (models/estimate.py `moe_terms`)

Dense and MoE blocks differ; the blocks term is the larger of the two for every block (a bound:
the 671B flavor has 3 dense blocks of 61, the 16B 1 of 27). Each MTP module adds, outside the
blocks and never checkpointed, a block of its own, its norms and eh_proj's input (2 x e*d + 3 x
(4d + 4)), and its cross-entropy's float32 log-softmax over the vocabulary (4V per token).
Derived from the bookkeeping above, not fitted. Measured once with saved-tensor hooks (CPU, fp32,
debug flavor, 2 x 32 tokens, SDPA): block 0 (dense) saves 1,668,096 bytes against the formula's
1,522,688 (-8.7%), block 1 (MoE) 1,680,224 against 1,529,120 (-9.0%); most of the gap is CPU
SDPA's math kernel (taken for values narrower than keys), which saves its scaled queries, keys and
score matrix, and which CUDA's fused kernels do not. Not yet a test, nor calibrated on a GPU."""

from __future__ import annotations

from models.deepseek_v3.args import DEEPSEEK_V3_VOCAB, DeepSeekV3Args
from models.estimate import attention_kernel, fsdp_outer_unit_params, moe_terms
from models.spec import ActivationTerms, Estimator


def _attention(args: DeepSeekV3Args, e: int, t: int, kernel: str) -> float:
    n, qk, v = args.n_heads, args.qk_head_dim, args.v_head_dim
    r_q, r_kv = args.q_lora_rank, args.kv_lora_rank
    q_latent = (2 * e * r_q + 4 * r_q + 4) if r_q else 0
    kv_latent = e * (r_kv + args.qk_rope_head_dim) + 4 * r_kv + 4 + e * r_kv
    sdpa = e * n * (2 * qk + v) / t + 2 * e * n * v / t + 4 * n / t
    if kernel == "varlen" and qk > v:
        sdpa += e * n * (qk - v) / t
    return q_latent + kv_latent + sdpa


def _block(args: DeepSeekV3Args, e: int, t: int, kernel: str, moe_block: bool, **shape) -> float:
    tokens = shape["local_batch_size"] * shape["seq_len"] // shape["cp"]
    d = args.dim
    norms = 2 * (4 * d + 4) / t
    per_token = norms + e * d + _attention(args, e, t, kernel)
    if not moe_block:
        return tokens * (per_token + e * d + 4 * e * args.ffn_hidden_dim / t)
    parts = moe_terms(args.moe, d, e, tokens=tokens // t, sequences=shape["local_batch_size"], tp=t)
    return tokens * (per_token + e * d / t) + sum(full for full, _ in parts.values())


def activations(
    args: DeepSeekV3Args,
    *,
    local_batch_size: int,
    seq_len: int,
    tp: int,
    cp: int,
    loss_parallel: bool,
    compute_bytes: int,
    device_type: str = "cuda",
) -> ActivationTerms:
    e, d, t = compute_bytes, args.dim, tp
    shape = dict(local_batch_size=local_batch_size, seq_len=seq_len, cp=cp)
    tokens = local_batch_size * seq_len // cp
    kernel = attention_kernel(args, device_type=device_type, compute_bytes=e, cp=cp)
    dense = _block(args, e, t, kernel, False, **shape)
    moe_args = args.moe
    sparse = _block(args, e, t, kernel, True, **shape) if moe_args is not None else 0.0
    full_block = max(dense, sparse)
    block_input = tokens * e * d / t
    logits_width = args.vocab_size / t if (loss_parallel or t == 1) else args.vocab_size
    mtp_block = sparse if moe_args is not None else dense
    mtp = args.mtp_depth * (
        mtp_block + tokens * (2 * e * d + 3 * (4 * d + 4) / t + 4 * logits_width)
    )
    moe = (
        {}
        if moe_args is None
        else moe_terms(moe_args, d, e, tokens=tokens // t, sequences=local_batch_size, tp=t)
    )
    return ActivationTerms(
        full_block=full_block,
        block_input=block_input,
        # Selective op checkpointing keeps every second matmul output and the SDPA output:
        # counted as half the block, an approximation until it is measured.
        op_block=full_block / 2 + block_input,
        outside=tokens * ((4 * d + 4) / t + e * d + 4 * logits_width) + mtp,
        shared=0.0,
        loss_backward=tokens * 8 * logits_width,
        moe=moe,
    )


ESTIMATOR = Estimator(activations, fsdp_outer_unit_params, DEEPSEEK_V3_VOCAB)
