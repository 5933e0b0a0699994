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
    """Which packed keys each packed query attends to, as flash varlen takes it: the queries of a
    (batch, seq) window flattened to tokens, cut into pieces (piece i is query rows
    cu_seqlens_q[i]:cu_seqlens_q[i+1]), each attending causally to its own key rows
    cu_seqlens_k[i]:cu_seqlens_k[i+1], aligned at the bottom right: a piece's last query sees all
    of its keys, its first sees the keys before the piece and itself.

    Without context parallel a piece is a document and its keys are its own tokens, so
    `cu_seqlens_k` is `cu_seqlens_q`. Under context parallel a piece is the part of a document
    that lies in one of this rank's chunks, and its keys are the document's tokens up to the
    piece's end, gathered from the whole sequence's keys: `key_index` gives, for each packed key
    row, its row in the flattened keys the kernel is given. A document never spans two
    sequences of the batch. `max_q` and `max_k` bound the pieces' lengths (the query and key
    sequence lengths, bounds rather than measurements, so compiled graphs see one value).
    (Finding the starts is one device-to-host sync per forward on CUDA, shared by every block:
    `nonzero` sizes its output.)"""

    cu_seqlens_q: torch.Tensor  # int32, (pieces + 1,)
    cu_seqlens_k: torch.Tensor  # int32, (pieces + 1,)
    max_q: int
    max_k: int
    key_index: torch.Tensor | None = None  # int64, (cu_seqlens_k[-1],)


AttentionMask = torch.Tensor | BlockMask | Documents | None


def choose_kernel(
    attn_type: str, mask_type: str, device_type: str, dtype: torch.dtype, positions: bool
) -> str:
    """The kernel "auto" stands for (any other `attn_type` is returned as it is). `positions`:
    the queries attend to chosen key positions (context parallel). Block-causal, and any mask
    under context parallel, use varlen: no mask to build, no compile, only the tiles inside a
    document are computed. FlexAttention does the same work but builds a BlockMask each step
    and needs a compile; it serves float32 on CUDA, which flash does not take, except under
    context parallel, where it is not wired and masked SDPA serves."""
    if attn_type != "auto":
        return attn_type
    if mask_type == "causal" and not positions:
        return "sdpa"
    if device_type == "cuda" and dtype not in (torch.bfloat16, torch.float16):
        return "sdpa" if positions else "flex"
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
    return Documents(cu_seqlens, cu_seqlens, seq, seq)


def document_pieces(
    tokens: torch.Tensor,
    bos_id: int,
    queries: torch.Tensor,
    keys: torch.Tensor,
    within_documents: bool = True,
) -> Documents:
    """The pieces of attention of queries at window positions `queries` against keys given at
    window positions `keys` (in the order the kernel receives them), for each sequence of the
    (batch, seq) window `tokens`: a piece is a run of consecutive query positions inside one
    document, and its keys are that document's positions up to the run's end. Without
    `within_documents` the whole sequence is one document (causal). Only the visible keys are
    ever computed against, so the work is what the mask allows, whatever the positions."""
    batch, seq = tokens.shape
    device, nq = tokens.device, queries.numel()
    idx = torch.arange(seq, device=device)
    starts = tokens == bos_id if within_documents else torch.zeros_like(tokens, dtype=torch.bool)
    starts[:, 0] = True
    doc_start = torch.where(starts, idx, 0).cummax(dim=-1).values
    follows = torch.zeros(nq, dtype=torch.bool, device=device)
    follows[1:] = queries[1:] == queries[:-1] + 1
    first = (starts[:, queries] | ~follows).flatten().nonzero().flatten()
    q_lens = torch.diff(first, append=first.new_tensor([batch * nq]))
    row, begin = first // nq, queries[first % nq]
    key_start = doc_start[row, begin]
    k_lens = begin + q_lens - key_start
    zero = first.new_zeros(1)
    cu_k = torch.cat([zero, k_lens.cumsum(0)])
    piece = torch.repeat_interleave(torch.arange(first.numel(), device=device), k_lens)
    offset = torch.arange(piece.numel(), device=device) - cu_k[piece]
    arrival = torch.empty_like(keys)
    arrival[keys] = torch.arange(keys.numel(), device=device)
    key_index = row[piece] * seq + arrival[key_start[piece] + offset]
    cu_q = torch.cat([first, first.new_tensor([batch * nq])]).to(torch.int32)
    cu_k = cu_k.to(torch.int32)
    for t in (cu_q, cu_k, key_index):  # sizes that change every step (see `documents`)
        torch._dynamo.maybe_mark_dynamic(t, 0)
    return Documents(cu_q, cu_k, nq, seq, key_index)


def causal_block_mask(batch: int, seq: int, device: torch.device) -> BlockMask:
    return create_block_mask(_causal, batch, None, seq, seq, device=device)


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


# ---------------------------------------------------------------------------------------------
# The CPU document kernel: torch's CPU flash attention on each piece. A custom op so that
# torch.compile keeps it whole (the loop's length depends on the data) and selective activation
# checkpointing can name it. A piece whose keys reach back before its first query (context
# parallel: the part of a document in a later chunk) is two flash calls, the earlier keys without
# a mask and the piece's own square with `is_causal`, merged by their log-sum-exps (as ring
# attention merges its steps). The backward calls the kernel's own backward on each call with
# the merged output and log-sum-exp, which gives each call's share of the gradient exactly (the
# softmax's normalizer and rowsum(dO·O) are the whole row's), so nothing is recomputed.

_cpu_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
_cpu_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default


class _Piece(NamedTuple):
    queries: slice
    earlier: slice  # keys before the piece's own square (empty without context parallel)
    own: slice  # the square: as many keys as queries, causal


def _pieces(cu_q: torch.Tensor, cu_k: torch.Tensor) -> list[_Piece]:
    qb, kb = cu_q.tolist(), cu_k.tolist()
    pieces = []
    for qs, qe, ks, ke in zip(qb[:-1], qb[1:], kb[:-1], kb[1:]):
        if qe > qs:
            own = ke - (qe - qs)
            pieces.append(_Piece(slice(qs, qe), slice(ks, own), slice(own, ke)))
    return pieces


def _heads_first(x: torch.Tensor) -> torch.Tensor:  # (tokens, heads, dim) -> (1, heads, ...)
    return x.transpose(0, 1).unsqueeze(0)


def _flash(q, k, v, causal: bool, scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    o, lse = _cpu_flash(*(_heads_first(t) for t in (q, k, v)), 0.0, causal, scale=scale)
    return o[0].transpose(0, 1), lse[0]  # (tokens, heads, dim), (heads, tokens)


@torch.library.custom_op("titanlite::document_attention", mutates_args=())
def document_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of each piece of packed (tokens, heads, head_dim) queries to its keys and
    values (fewer heads for grouped-query attention), causal aligned at the bottom right (see
    `Documents`), softmax scale `scale` (None: 1/sqrt(head_dim)) -> (output like q, log-sum-exp
    (heads, tokens) in float32)."""
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)
    for p in _pieces(cu_seqlens_q, cu_seqlens_k):
        o, l_own = _flash(q[p.queries], k[p.own], v[p.own], True, scale)
        if p.earlier.stop > p.earlier.start:
            o_before, l_before = _flash(q[p.queries], k[p.earlier], v[p.earlier], False, scale)
            merged = torch.logaddexp(l_own, l_before)
            o = (
                o.float() * (l_own - merged).exp().T[..., None]
                + o_before.float() * (l_before - merged).exp().T[..., None]
            )
            l_own = merged
        out[p.queries] = o
        lse[:, p.queries] = l_own
    return out, lse


@document_attention.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, scale=None):
    return torch.empty_like(q), q.new_empty(q.shape[1], q.shape[0], dtype=torch.float32)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:5], *output)
    ctx.scale = inputs[5]


def _backward(ctx, grad_out, _grad_lse):
    grads = _document_attention_backward(grad_out, *ctx.saved_tensors, ctx.scale)
    return (*grads, None, None, None)


@torch.library.custom_op("titanlite::document_attention_backward", mutates_args=())
def _document_attention_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gq, gk, gv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for p in _pieces(cu_seqlens_q, cu_seqlens_k):
        rows, row_lse = p.queries, lse[None, :, p.queries]
        for keys, causal in ((p.own, True), (p.earlier, False)):
            if keys.stop == keys.start:
                continue
            grads = _cpu_flash_backward(
                *(_heads_first(t) for t in (grad_out[rows], q[rows], k[keys], v[keys], out[rows])),
                row_lse,
                0.0,
                causal,
                scale=scale,
            )
            gq[rows] += grads[0][0].transpose(0, 1)
            gk[keys] = grads[1][0].transpose(0, 1)
            gv[keys] = grads[2][0].transpose(0, 1)
    return gq, gk, gv


@_document_attention_backward.register_fake
def _(grad_out, q, k, v, cu_seqlens_q, cu_seqlens_k, out, lse, scale=None):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


document_attention.register_autograd(_backward, setup_context=_setup_context)


# ---------------------------------------------------------------------------------------------


def _varlen(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: Documents, scale: float | None
) -> torch.Tensor:
    """(batch, heads, seq, head_dim) in and out, through the packed (tokens, heads, head_dim)
    layout; the transposes undo the model's, so the reshapes are views. Values narrower than
    the queries and keys (multi-head latent attention: 128 against 192) are padded with zeros to
    their width, since both flash kernels take one head size, and the output's padding is cut
    off (the padding's share of the work: (qk - v) / qk of the value side). Under context parallel
    the keys and values are first gathered into each piece's rows (`docs.key_index`): a row is
    copied once per piece that sees it, at most (1 + 1/(2·cp)) x the sequence's keys with the
    head-tail cut, and the copy's gradient adds back into the gathered keys."""
    batch, heads, seq, dim = q.shape
    value_dim = v.shape[-1]
    if value_dim != dim:
        v = F.pad(v, (0, dim - value_dim))
    pq, pk, pv = (t.transpose(1, 2).reshape(-1, t.shape[1], dim) for t in (q, k, v))
    if docs.key_index is not None:
        pk, pv = pk.index_select(0, docs.key_index), pv.index_select(0, docs.key_index)
    cu_q, cu_k = docs.cu_seqlens_q, docs.cu_seqlens_k
    if q.device.type == "cpu":
        out = document_attention(pq, pk, pv, cu_q, cu_k, scale)[0]
    else:
        # Imported on first use: the module imports FSDP, which preflight never needs.
        from torch.nn.attention.varlen import varlen_attn

        # window (-1, 0) is flash's causal, which aligns a piece's queries with its last keys
        # (bottom right) when it has more keys than queries: what context parallel's pieces need.
        out = varlen_attn(
            pq,
            pk,
            pv,
            cu_q,
            cu_k,
            docs.max_q,
            docs.max_k,
            scale=scale,
            window_size=(-1, 0),
            enable_gqa=k.shape[1] != heads,
        )
    out = out.view(batch, seq, heads, dim)[..., :value_dim]
    return out.transpose(1, 2)


_compiled_flex: Callable[..., torch.Tensor] | None = None


def _flex(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: BlockMask, scale: float | None
) -> torch.Tensor:
    # Compiled once per process, lazily: uncompiled FlexAttention materializes the whole score
    # matrix (it exists for debugging), and compiling at import would cost every user of models/.
    global _compiled_flex
    if _compiled_flex is None:
        _compiled_flex = cast(Callable[..., torch.Tensor], torch.compile(flex_attention))
    gqa = k.shape[1] != q.shape[1]
    return _compiled_flex(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa)


# Masked SDPA on CUDA may only use the fused kernels that take a mask: the MATH fallback holds
# float32 S×S scores and probabilities per call (out of memory, or 10-20x slower, silently).
_MASKED_CUDA_KERNELS = [SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]


def _masked_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float | None
):
    gqa = k.shape[1] != q.shape[1]
    if q.device.type != "cuda":
        return F.scaled_dot_product_attention(q, k, v, mask, scale=scale, enable_gqa=gqa)
    try:
        with sdpa_kernel(_MASKED_CUDA_KERNELS):
            return F.scaled_dot_product_attention(q, k, v, mask, scale=scale, enable_gqa=gqa)
    except RuntimeError as e:
        if "No available kernel" not in str(e):
            raise
        raise RuntimeError(
            "masked SDPA has no fused kernel for these inputs on this GPU (torch would fall "
            "back to its float32 MATH kernel); use attn_type = 'auto' or 'varlen', which need "
            "no mask"
        ) from None


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: AttentionMask,
    scale: float | None = None,
) -> torch.Tensor:
    """(batch, heads, seq, head_dim) queries, keys and values (fewer key/value heads for
    grouped-query attention; values may be narrower than queries and keys) -> the attention
    output, by the kind of `mask`: None (causal), Documents (varlen), a BlockMask
    (FlexAttention) or a tensor (masked SDPA). `scale`: the softmax scale, None for
    1/sqrt(head_dim)."""
    if mask is None:
        gqa = k.shape[1] != q.shape[1]
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    if isinstance(mask, Documents):
        return _varlen(q, k, v, mask, scale)
    if isinstance(mask, BlockMask):
        return _flex(q, k, v, mask, scale)
    return _masked_sdpa(q, k, v, mask, scale)
