"""Activation memory of a training step of the shared decoder block (models/decoder.py: Llama,
Qwen3), per rank, from the shapes alone: the terms of a block for the dry run
(titanlite.planning.activation_memory combines them with the activation-checkpointing mode and
the pipeline stage). Each family's `Estimator` (models/<family>/estimate.py) is these formulas
with its own vocabulary and outer FSDP unit.

The formula counts what autograd saves for backward in the block (the same bookkeeping as
Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", redone for
RMSNorm, RoPE, grouped-query SDPA attention and SwiGLU). Per token and per block, with compute
dtype size e, dim d, query width q = n_heads x head_dim (d for Llama; wider for Qwen3),
key/value width kv = n_kv_heads x head_dim, FFN hidden size F, heads n and tensor-parallel
degree t (sequence parallel: norms work on 1/t of the tokens):

    norms       2 x (4d/t + 4/t)        fp32 input and 1/rstd of each RMSNorm
    gathered    2 x e*d                 each norm's output, all-gathered for the q/k/v and w1/w3
                                        matmuls (saved whole on every TP rank)
    attention   e*(q + 2kv)/t           q, k, v after RoPE (SDPA inputs)
                2 x e*q/t + 4n/t        SDPA output, its contiguous copy for wo, log-sum-exp
    q/k norms   8(q + kv)/t             with per-head query/key norms (Qwen3): each norm's fp32
                + 4(n + n_kv)/t         input, its normalized fp32 values (the weight's
                                        gradient needs them) and 1/rstd per head (RoPE saves
                                        only its table); measured exactly, fp32, in
                                        tests/unit/models/qwen3/test_qwen3_model.py
    SwiGLU      4 x e*F/t               w1 and w3 outputs, silu(w1), their product (w2 input)

A Mixture-of-Experts feed-forward (models/moe.py; E experts, k per token, expert width h; no
expert parallel yet) replaces the SwiGLU term; its input is the norm output counted above, which
under tensor parallel is not gathered (the MoE runs on this rank's sequence shard,
parallelisms/moe_tp.py: e*d/t instead of e*d). Per token of the shard (`moe_terms`):

    router      4E + 8k                 float32 scores (softmax/sigmoid output), top-k indices
                + 4k + 4                the chosen float32 weights and their sum (renormalized,
                                        norm_topk_prob)
    dispatch    3 x e*k*d + e*k + 16k   the token copies sorted by expert (the first grouped
                                        GEMM's input), the experts' outputs and their weighted
                                        copies (index_copy keeps its source), each slot's weight,
                                        and the sort's two int64 indices (order // k, order)
    grouped     4 x e*k*h               w13's output (gate and up rows), silu(gate), the product
    GEMMs                               (w2's input)
    shared      4 x e*Fs                shared experts: a SwiGLU of width Fs
Once per forward and layer: the int32 group ends (4E) and, with the auxiliary loss, the float32
routed shares of each sequence (4E per sequence; 8E under tensor parallel, where shares and
probabilities are averaged over the tp ranks as one tensor). Measured byte for byte in float32
and bfloat16 (saved-tensor hooks on the debug MoE's first layer, and under tensor parallel 2 on
a fake process group, tests/unit/models/test_moe_estimate.py).
Selective op checkpointing keeps, of an MoE, the router gate's output (e*E per token: the fifth
matmul of the block; the grouped GEMMs are not on its list, parallelisms/activation_checkpoint.py)
and, with shared experts, their w3 output; derived from the policy, not measured.

Outside the blocks: the final norm (4d/t + e*d) and the loss: log-softmax saves float32 logits
over the vocabulary V (V/t with loss parallel), and backward's first step holds two float32
gradients of the same size beside it (nll_loss's, dense, and log-softmax's input's), 8 bytes per
token x V transient, counted in the peak. The compute-dtype logits are not alive by then (the
trainer's step frees them before backward). Measured: 12.00 bytes per token x V in all, in bf16
and in fp32, through the trainer's step (`python scripts/loss_memory.py`). Not counted: under
pipeline parallel torch's last stage keeps its output, the logits, until that micro-batch's
backward (`fwd_cache` in torch/distributed/pipelining/stage.py): e more bytes per token x V.

Document masking (block_causal) through SDPA adds the boolean mask, batch x seq x seq bytes,
built once per micro-batch and shared by every block; and, per block, the additive copy in the
compute dtype that SDPA makes of a boolean mask and saves for backward (e x seq per token, on
every TP rank: the mask covers the whole sequence and is broadcast over the heads; measured on
torch 2.13 CPU with saved-tensor hooks). FlexAttention's BlockMask holds a few int32 per
128 x 128 tile: not counted.

Context parallel (cp ranks share each sequence; see parallelisms/context_parallel.py): every
per-token term above counts this rank's tokens, batch x seq/cp, because each rank embeds, projects
and normalizes only its own part of each sequence, and computes the logits and loss of its own
positions. What attention needs of the rest of the sequence does not shrink with cp; it depends
on the kernel ("auto" is varlen, except float32 on CUDA, where it is masked SDPA):

    keys/values varlen: the rows its pieces copy from the all-gathered keys and values, which
                the kernel keeps: at most seq x (1 + 1/(2 cp)) per sequence (the head-tail
                cut, one document per window: rank i's tail piece reads every key before it,
                its head piece the first chunks again; documents that end inside a chunk copy
                fewer, so the formula is a bound there), i.e. e*2kv x (cp + 1/2)/t per local
                token (replacing e*2kv/t).
                masked SDPA: the whole sequence's, e*2kv x cp/t per local token.
                (The all-gather itself needs nothing saved to reduce-scatter the gradients.)
    once per    varlen: the int64 key rows of the pieces (8 bytes per copied row; no mask).
    forward     masked SDPA: the additive mask of this rank's queries against all keys,
                e x seq/cp x seq bytes (times the batch under block_causal), built in the
                compute dtype so that SDPA keeps it as it is and every block shares it. It
                replaces, under block_causal, both the window's batch x seq x seq booleans and
                the per-block additive copy (the e x seq per token above); a causal model needs
                it because this rank's queries against all keys are no longer a square causal
                pattern.
                Both: the RoPE rows of this rank's positions (seq/cp x head_dim/2 complex64
                values; per sequence with document positions).

What is made once per forward is made before the first block and is an input of every block,
so checkpointing keeps it whatever its mode. Measured on torch 2.13 CPU on a fake 2-rank group
with saved-tensor hooks, per kernel (tests/unit/test_activation_memory.py). On CUDA the kernel
that takes a mask is cuDNN or memory-efficient attention (titanlite allows no other), which
save the same inputs; not measured here. Selective op checkpointing was measured to keep no
per-block additive mask without cp either, so the block_causal term it adds per block
over-counts; it stays until the no-cp calibration settles it.

Under activation checkpointing a block keeps its input (e*d/t per token); selective op
checkpointing keeps, besides, every second matmul output (wq, wv, w1, w2 in forward order), the
SDPA output and log-sum-exp.
Calibrated against torch's MemTracker on real CPU runs: see docs/dry_run.md.
"""

from __future__ import annotations

from typing import Any

import torch

from models.attention import choose_kernel
from models.spec import ActivationTerms


def attention_kernel(args: Any, *, device_type: str, compute_bytes: int, cp: int) -> str:
    """The kernel the blocks run ("auto" resolved as the model resolves it for this device)."""
    dtype = torch.float32 if compute_bytes == 4 else torch.bfloat16
    return choose_kernel(args.attn_type, args.attn_mask_type, device_type, dtype, cp > 1)


def cp_key_rows(seq_len: int, cp: int, kernel: str) -> float:
    """Rows of keys (and of values) one sequence's attention keeps per block under context
    parallel: all of the sequence's for masked SDPA; for varlen the rows its pieces copy, at
    most seq x (1 + 1/(2 cp)) (the head-tail cut with one document per window; documents that
    end inside a chunk copy fewer)."""
    return seq_len * (1 + 1 / (2 * cp)) if kernel == "varlen" else seq_len


def moe_terms(
    moe: Any, dim: int, compute_bytes: int, *, tokens: int, sequences: int, tp: int = 1
) -> dict[str, tuple[float, float]]:
    """An MoE feed-forward's activations for `tokens` tokens (this rank's: under tensor parallel
    its sequence shard) in `sequences` sequences (one forward of one layer), by part:
    {part: (bytes without checkpointing, bytes selective op checkpointing keeps)} (the module
    docstring gives the terms)."""
    e, d, k, n_e, h = compute_bytes, dim, moe.top_k, moe.num_experts, moe.hidden_dim
    router = 4 * n_e + 8 * k + (4 * k + 4 if moe.norm_topk_prob else 0)
    # Under tp the shares and probabilities are averaged over the ranks as one (sequences, 2E)
    # tensor, of which the product keeps both halves.
    aux_share = 4 * n_e * sequences * (2 if tp > 1 else 1)
    aux_share = aux_share if moe.load_balance == "aux_loss" else 0
    parts = {
        "router": (tokens * router + aux_share, tokens * e * n_e),
        "dispatch": (tokens * (3 * e * k * d + e * k + 16 * k), 0),
        "grouped GEMMs": (tokens * 4 * e * k * h + 4 * n_e, 0),
    }
    if moe.shared_hidden_dim:
        parts["shared experts"] = (
            tokens * 4 * e * moe.shared_hidden_dim,
            tokens * e * moe.shared_hidden_dim,
        )
    return parts


def block_activations(
    args: Any,
    *,
    local_batch_size: int,
    seq_len: int,
    tp: int,
    cp: int,
    compute_bytes: int,
    kernel: str,
    qk_norm: bool = False,
) -> tuple[float, float, float]:
    """(one block without checkpointing, its input, what selective op checkpointing keeps of
    it): bytes for this rank's tokens of a micro-batch, with attention through `kernel`."""
    e, d, t, n = compute_bytes, args.dim, tp, args.n_heads
    q, kv, ffn = n * args.head_dim, args.kv_heads * args.head_dim, args.ffn_hidden_dim
    tokens = local_batch_size * seq_len // cp  # this rank's tokens

    norms = 2 * (4 * d + 4) / t
    moe = getattr(args, "moe", None)
    # An MoE runs on the sequence shard (parallelisms/moe_tp.py): its norm output is not gathered.
    gathered = 2 * e * d if moe is None else e * d + e * d / t
    # Keys and values: under context parallel those the kernel is given of the whole sequence.
    kv_per_token = cp_key_rows(seq_len, cp, kernel) / (seq_len // cp) if cp > 1 else 1
    attention = e * (q + 2 * kv * kv_per_token) / t + 2 * e * q / t + 4 * n / t
    if qk_norm:
        attention += (8 * (q + kv) + 4 * (n + args.kv_heads)) / t
    # Only masked SDPA builds a dense mask ("varlen" and "flex" keep no S×S tensor).
    sdpa_mask = args.attn_mask_type == "block_causal" and kernel == "sdpa"
    per_block_mask = sdpa_mask and cp == 1  # under cp one shared additive mask (docstring)
    if per_block_mask:
        attention += e * seq_len  # SDPA's additive copy of the boolean mask, one per block
    block_input = tokens * e * d / t
    if moe is None:
        feed_forward = tokens * 4 * e * ffn / t  # SwiGLU
        # Selective op: every second matmul output (wq, wv, w1, w2) + SDPA output + input;
        # w2's partial sums before the reduce-scatter, and its result.
        op_ffn = e * ffn / t + (e * d if t == 1 else e * d + e * d / t)
    else:
        parts = moe_terms(moe, d, e, tokens=tokens // t, sequences=local_batch_size, tp=t)
        feed_forward = sum(full for full, _ in parts.values())
        op_ffn = sum(kept for _, kept in parts.values()) / tokens
    full_block = tokens * (norms + gathered + attention) + feed_forward
    op_block = tokens * (e * (q + kv) / t + op_ffn + e * q / t + 4 * n / t) + block_input
    if per_block_mask:  # an over-count: SAC keeps no additive mask (module docstring)
        op_block += tokens * e * seq_len
    return full_block, block_input, op_block


def shared_activations(
    args: Any,
    *,
    local_batch_size: int,
    seq_len: int,
    cp: int,
    compute_bytes: int,
    kernel: str,
) -> float:
    """What the model builds once per forward and every block reads: the masks (or varlen's
    key rows) and, under context parallel, the RoPE rows of this rank's positions."""
    e = compute_bytes
    if cp > 1:
        rows = seq_len // cp  # this rank's query positions
        rope_rows = rows * (1 if args.rope_positions == "window" else local_batch_size)
        rope = rope_rows * args.head_dim // 2 * 8  # complex64
        if kernel == "varlen":  # int64 key rows of the pieces (their bounds are a few ints)
            return 8 * local_batch_size * cp_key_rows(seq_len, cp, kernel) + rope
        per_sequence = args.attn_mask_type == "block_causal"
        masks = e * rows * seq_len * (local_batch_size if per_sequence else 1)
        return masks + rope
    sdpa_mask = args.attn_mask_type == "block_causal" and kernel == "sdpa"
    return local_batch_size * seq_len * seq_len if sdpa_mask else 0  # boolean


def activations(
    args: Any,
    *,
    local_batch_size: int,
    seq_len: int,
    tp: int,
    cp: int,
    loss_parallel: bool,
    compute_bytes: int,
    device_type: str = "cuda",
    qk_norm: bool = False,
) -> ActivationTerms:
    """The terms of a micro-batch of `local_batch_size` sequences of `seq_len` tokens (the whole
    sequence: `cp` ranks share each) on one rank of `tp` tensor-parallel ranks, with attention
    through the kernel "auto" picks on `device_type`."""
    e, d, t = compute_bytes, args.dim, tp
    tokens = local_batch_size * seq_len // cp  # this rank's tokens
    kernel = attention_kernel(args, device_type=device_type, compute_bytes=e, cp=cp)
    shape = dict(local_batch_size=local_batch_size, seq_len=seq_len, cp=cp, compute_bytes=e)
    full_block, block_input, op_block = block_activations(
        args, tp=tp, kernel=kernel, qk_norm=qk_norm, **shape
    )
    logits_width = args.vocab_size / t if (loss_parallel or t == 1) else args.vocab_size
    moe = getattr(args, "moe", None)
    return ActivationTerms(
        full_block=full_block,
        block_input=block_input,
        op_block=op_block,
        outside=tokens * ((4 * d + 4) / t + e * d + 4 * logits_width),
        shared=shared_activations(args, kernel=kernel, **shape),
        loss_backward=tokens * 8 * logits_width,
        moe={}
        if moe is None
        else moe_terms(moe, d, e, tokens=tokens // t, sequences=local_batch_size, tp=t),
    )


def fsdp_outer_unit_params(args: Any) -> int:
    """The final norm and the output head (one FSDP unit; the embedding, the other, is smaller
    by the norm)."""
    return args.vocab_size * args.dim + args.dim
