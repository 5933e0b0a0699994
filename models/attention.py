"""Attention kernels and the masks they take, for any family whose blocks attend causally within
documents. Nothing here knows about a model's shapes or about parallelism.

Kernels (`attn_type`):
- "sdpa": scaled_dot_product_attention; `is_causal` for causal, a dense (batch, 1, S, S) boolean
  mask for block_causal (every tile is computed, and the mask is S² bytes per sequence).
- "flex": compiled FlexAttention with a BlockMask (CUDA only for training: torch 2.13 has no
  FlexAttention backward on CPU).
- "varlen": attention per document over the flattened batch, described by `Documents`
  (cumulative document starts): torch's flash `varlen_attn` on CUDA, and on CPU
  `titanlite::document_attention`, which runs torch's CPU flash kernel with `is_causal` on each
  document. Only the work the mask allows is done, and no S×S mask exists.
- "auto": the kernel `choose_kernel` picks for the device, dtype and mask.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, cast

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

ATTN_TYPES = ("auto", "sdpa", "flex", "varlen")
ATTN_MASK_TYPES = ("causal", "block_causal")


class Documents(NamedTuple):
    """The documents of a (batch, seq) window of tokens, flattened to batch·seq tokens: document
    i is tokens cu_seqlens[i]:cu_seqlens[i+1]. A document never spans two sequences of the batch.
    `max_len` bounds every document's length: the sequence length, a bound rather than a
    measurement, so compiled graphs see one value. (Finding the starts is one device-to-host
    sync per forward on CUDA, shared by every block: `nonzero` sizes its output.)"""

    cu_seqlens: torch.Tensor  # int32, (number of documents + 1,)
    max_len: int


AttentionMask = torch.Tensor | BlockMask | Documents | None


def choose_kernel(
    attn_type: str, mask_type: str, device_type: str, dtype: torch.dtype, positions: bool
) -> str:
    """The kernel "auto" stands for (any other `attn_type` is returned as it is). `positions`:
    the queries attend to chosen key positions (context parallel), which only masked SDPA
    takes. On CUDA, block_causal in 16-bit uses flash varlen: no mask to build, no compile,
    the kernel skips every tile outside a document. FlexAttention does the same work but builds
    a BlockMask each step and needs a compile; it serves float32, which flash does not take."""
    if attn_type != "auto":
        return attn_type
    if mask_type == "causal" or positions:
        return "sdpa"
    if device_type == "cuda" and dtype not in (torch.bfloat16, torch.float16):
        return "flex"
    return "varlen"


def document_ids(tokens: torch.Tensor, bos_id: int) -> torch.Tensor:
    """(batch, seq) -> the index of each token's document within its window: it counts the BOS
    tokens up to and including the token, so tokens before the first BOS (a document that began
    in an earlier window) are document 0."""
    return (tokens == bos_id).cumsum(dim=-1)


def document_positions(tokens: torch.Tensor, bos_id: int) -> torch.Tensor:
    """(batch, seq) -> each token's offset from its document's first token within the window;
    the tokens before the first BOS count from the window start, as their document's earlier
    tokens are not in the window."""
    idx = torch.arange(tokens.shape[-1], device=tokens.device)
    starts = torch.where(tokens == bos_id, idx, 0).cummax(dim=-1).values
    return idx - starts


def block_causal_mask(tokens: torch.Tensor, bos_id: int) -> torch.Tensor:
    """Boolean (batch, 1, seq, seq) mask, True where query i may attend to key j: j <= i and both
    in the same document. The singleton dim broadcasts over the heads."""
    docs = document_ids(tokens, bos_id)
    seq = tokens.shape[-1]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=tokens.device).tril()
    return ((docs[:, :, None] == docs[:, None, :]) & causal)[:, None]


def block_causal_block_mask(tokens: torch.Tensor, bos_id: int) -> BlockMask:
    docs = document_ids(tokens, bos_id)

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (docs[b, q_idx] == docs[b, kv_idx])

    batch, seq = tokens.shape
    return create_block_mask(mask_mod, batch, None, seq, seq, device=tokens.device)


def documents(tokens: torch.Tensor, bos_id: int) -> Documents:
    """Where each document of the (batch, seq) window starts in the flattened batch: at every
    BOS and at every sequence's first token."""
    batch, seq = tokens.shape
    starts = tokens == bos_id
    starts[:, 0] = True
    flat = starts.flatten().nonzero().flatten()
    end = torch.tensor([batch * seq], device=tokens.device)
    cu_seqlens = torch.cat([flat, end]).to(torch.int32)
    # The number of documents changes every step: compiled blocks take it as a symbol from the
    # first step on, instead of compiling once for the first count and again for the second.
    torch._dynamo.maybe_mark_dynamic(cu_seqlens, 0)
    return Documents(cu_seqlens, seq)


def causal_block_mask(batch: int, seq: int, device: torch.device) -> BlockMask:
    return create_block_mask(_causal, batch, None, seq, seq, device=device)


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


# ---------------------------------------------------------------------------------------------
# The CPU document kernel: torch's CPU flash attention, causal, on each document. A custom op so
# that torch.compile keeps it whole (the loop's length depends on the data) and selective
# activation checkpointing can name it; its backward calls the kernel's own backward per
# document with the saved output and log-sum-exp, so nothing is recomputed.

_cpu_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
_cpu_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def _spans(cu_seqlens: torch.Tensor) -> list[tuple[int, int]]:
    bounds = cu_seqlens.tolist()
    return [(s, e) for s, e in zip(bounds[:-1], bounds[1:]) if e > s]


def _heads_first(x: torch.Tensor) -> torch.Tensor:  # (tokens, heads, dim) -> (1, heads, ...)
    return x.transpose(0, 1).unsqueeze(0)


@torch.library.custom_op("titanlite::document_attention", mutates_args=())
def document_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention within each document of packed (tokens, heads, head_dim) queries, keys
    and values (keys and values may have fewer heads: grouped-query attention) -> (output like
    q, log-sum-exp (heads, tokens) in float32)."""
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)
    for s, e in _spans(cu_seqlens):
        o, logsumexp = _cpu_flash(*(_heads_first(t[s:e]) for t in (q, k, v)), 0.0, True)
        out[s:e] = o[0].transpose(0, 1)
        lse[:, s:e] = logsumexp[0]
    return out, lse


@document_attention.register_fake
def _(q, k, v, cu_seqlens):
    return torch.empty_like(q), q.new_empty(q.shape[1], q.shape[0], dtype=torch.float32)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, cu_seqlens, out, lse)


def _backward(ctx, grad_out, _grad_lse):
    q, k, v, cu_seqlens, out, lse = ctx.saved_tensors
    return (*_document_attention_backward(grad_out, q, k, v, cu_seqlens, out, lse), None)


@torch.library.custom_op("titanlite::document_attention_backward", mutates_args=())
def _document_attention_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gq, gk, gv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for s, e in _spans(cu_seqlens):
        grads = _cpu_flash_backward(
            _heads_first(grad_out[s:e]),
            *(_heads_first(t[s:e]) for t in (q, k, v, out)),
            lse[None, :, s:e],
            0.0,
            True,
        )
        for full, g in zip((gq, gk, gv), grads):
            full[s:e] = g[0].transpose(0, 1)
    return gq, gk, gv


@_document_attention_backward.register_fake
def _(grad_out, q, k, v, cu_seqlens, out, lse):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


document_attention.register_autograd(_backward, setup_context=_setup_context)


# ---------------------------------------------------------------------------------------------


def _varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: Documents) -> torch.Tensor:
    """(batch, heads, seq, head_dim) in and out, through the packed (tokens, heads, head_dim)
    layout; the transposes undo the model's, so the reshapes are views."""
    batch, heads, seq, dim = q.shape
    pq, pk, pv = (t.transpose(1, 2).reshape(batch * seq, t.shape[1], dim) for t in (q, k, v))
    cu, n = docs.cu_seqlens, docs.max_len
    if q.device.type == "cpu":
        out = document_attention(pq, pk, pv, cu)[0]
    else:
        # Imported on first use: the module imports FSDP, which preflight never needs.
        from torch.nn.attention.varlen import varlen_attn

        out = varlen_attn(
            pq, pk, pv, cu, cu, n, n, window_size=(-1, 0), enable_gqa=k.shape[1] != heads
        )
    return out.view(batch, seq, heads, dim).transpose(1, 2)


_compiled_flex: Callable[..., torch.Tensor] | None = None


def _flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: BlockMask) -> torch.Tensor:
    # Compiled once per process, lazily: uncompiled FlexAttention materializes the whole score
    # matrix (it exists for debugging), and compiling at import would cost every user of models/.
    global _compiled_flex
    if _compiled_flex is None:
        _compiled_flex = cast(Callable[..., torch.Tensor], torch.compile(flex_attention))
    return _compiled_flex(q, k, v, block_mask=block_mask, enable_gqa=k.shape[1] != q.shape[1])


# Masked SDPA on CUDA may only use the fused kernels that take a mask: the MATH fallback holds
# float32 S×S scores and probabilities per call (out of memory, or 10-20x slower, silently).
_MASKED_CUDA_KERNELS = [SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]


def _masked_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor):
    gqa = k.shape[1] != q.shape[1]
    if q.device.type != "cuda":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    try:
        with sdpa_kernel(_MASKED_CUDA_KERNELS):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    except RuntimeError as e:
        if "No available kernel" not in str(e):
            raise
        raise RuntimeError(
            "masked SDPA has no fused kernel for these inputs on this GPU (torch would fall "
            "back to its float32 MATH kernel); use attn_type = 'auto' or 'varlen', which need "
            "no mask"
        ) from None


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask) -> torch.Tensor:
    """(batch, heads, seq, head_dim) queries, keys and values (fewer key/value heads for
    grouped-query attention) -> the attention output, by the kind of `mask`: None (causal),
    Documents (varlen), a BlockMask (FlexAttention) or a tensor (masked SDPA)."""
    if mask is None:
        gqa = k.shape[1] != q.shape[1]
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    if isinstance(mask, Documents):
        return _varlen(q, k, v, mask)
    if isinstance(mask, BlockMask):
        return _flex(q, k, v, mask)
    return _masked_sdpa(q, k, v, mask)
