"""Llama 3, written to read like the paper: RMSNorm, RoPE (with Llama 3.1 frequency scaling),
grouped-query attention through the kernels of `models.attention`, SwiGLU, an untied output head.

Attention masks (`args.attn_mask_type`): "causal", or "block_causal", where a token attends only
to earlier tokens of its own document. Document boundaries come from the input tokens themselves
(a document starts at each `args.bos_id`), so no data format carries them. The mask is built once
per forward, before the blocks, and every block receives the same object, the one its kernel
(`args.attn_type`, "auto" resolved for the device and dtype) takes: `Documents` (the document
starts, or under context parallel the pieces of documents each rank's queries attend to) for
"varlen", a `BlockMask` for FlexAttention, a boolean (batch, 1, seq, seq) tensor for
masked SDPA, None for causal SDPA.

RoPE positions (`args.rope_positions`): "window" counts from the window start; "document"
restarts at each document's first token (computed once per forward, beside the mask). Under
block_causal both give the same function up to float rounding.

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
from torch.nn.attention.flex_attention import BlockMask

from models.attention import (
    AttentionMask,
    attend,
    block_causal_block_mask,
    block_causal_mask,
    causal_block_mask,
    choose_kernel,
    document_ids,
    document_pieces,
    document_positions,
    documents,
)
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


Positions = tuple[torch.Tensor, torch.Tensor]  # (query positions, key positions) in the window


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
    and values of the whole sequence first)."""

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask = None
    ) -> torch.Tensor:
        return attend(q, k, v, mask)


class Attention(nn.Module):
    def __init__(self, args: LlamaArgs):
        super().__init__()
        self.head_dim = args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)
        self.sdpa = ScaledDotProductAttention()

    def forward(
        self, x: torch.Tensor, freqs: torch.Tensor, mask: AttentionMask = None
    ) -> torch.Tensor:
        """`mask`: what `models.attention.attend` takes (None for causal)."""
        bs, seq, _ = x.shape
        q = self.wq(x).view(bs, seq, -1, self.head_dim)
        k = self.wk(x).view(bs, seq, -1, self.head_dim)
        v = self.wv(x).view(bs, seq, -1, self.head_dim)
        q, k = apply_rope(q, k, freqs)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (batch, heads, seq, head_dim)
        out = self.sdpa(q, k, v, mask)
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

    def forward(
        self, x: torch.Tensor, freqs: torch.Tensor, mask: AttentionMask = None
    ) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs, mask)
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
        # Optional: a pipeline stage is a copy without the parts other stages own.
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(args.vocab_size, args.dim)
        # A dict keyed by the layer number keeps checkpoint keys stable if layers are dropped
        # or moved (as pipeline stages do).
        self.layers = nn.ModuleDict(
            {str(i): TransformerBlock(i, args) for i in range(args.n_layers)}
        )
        self.norm: RMSNorm | None = RMSNorm(args.dim, args.norm_eps)
        self.output: nn.Linear | None = nn.Linear(args.dim, args.vocab_size, bias=False)
        # Not persistent: derived from args, so checkpoints need not carry it.
        self.register_buffer(
            "freqs_cis", rope_frequencies(args, args.max_seq_len), persistent=False
        )
        self._causal_block_masks: dict[tuple[int, int, torch.device], BlockMask] = {}

    def attention_mask(
        self,
        tokens: torch.Tensor,
        positions: Positions | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> AttentionMask:
        """The mask every block uses for this batch of (batch, seq) tokens. With `positions`
        (query positions, key positions in the window), the attention of those queries against
        those keys: for varlen the pieces that need computing (`Documents` with the key rows of
        each, no mask); for SDPA an additive mask in `dtype` (SDPA saves a float mask for
        backward as it is, so every block shares this one, where it would save a float copy of
        a boolean mask per block)."""
        a = self.args
        if a.attn_mask_type == "block_causal" and a.bos_id < 0:
            raise ValueError("block_causal attention needs args.bos_id (the BOS token id)")
        device = tokens.device.type
        # Under autocast the blocks compute in its dtype, whatever the embedding's output is.
        compute = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else dtype
        kernel = choose_kernel(
            a.attn_type, a.attn_mask_type, device, compute, positions is not None
        )
        if positions is not None:
            if kernel == "varlen":
                block_causal = a.attn_mask_type == "block_causal"
                return document_pieces(tokens, a.bos_id, *positions, within_documents=block_causal)
            if kernel != "sdpa":
                raise ValueError(
                    "attention between chosen positions needs attn_type 'sdpa' or 'varlen'"
                )
            return self._positions_mask(tokens, positions, dtype)
        if a.attn_mask_type == "causal":
            return None if kernel in ("sdpa", "varlen") else self._causal_block_mask(tokens)
        if kernel == "varlen":
            return documents(tokens, a.bos_id)
        if kernel == "flex":
            return block_causal_block_mask(tokens, a.bos_id)
        return block_causal_mask(tokens, a.bos_id)

    def _positions_mask(
        self, tokens: torch.Tensor, positions: Positions, dtype: torch.dtype
    ) -> torch.Tensor:
        queries, keys = positions
        visible = queries[:, None] >= keys[None, :]
        if self.args.attn_mask_type == "block_causal":
            docs = document_ids(tokens, self.args.bos_id)
            visible = visible & (docs[:, queries, None] == docs[:, None, keys])
        visible = visible[None, None] if visible.ndim == 2 else visible[:, None]
        mask = torch.zeros(visible.shape, dtype=dtype, device=tokens.device)
        return mask.masked_fill_(~visible, float("-inf"))

    def _causal_block_mask(self, tokens: torch.Tensor) -> BlockMask:
        # FlexAttention's plain causal BlockMask depends only on the shape: built once per shape.
        batch, seq = tokens.shape
        key = (batch, seq, tokens.device)
        if key not in self._causal_block_masks:
            self._causal_block_masks[key] = causal_block_mask(batch, seq, tokens.device)
        return self._causal_block_masks[key]

    def rope_freqs(
        self, tokens: torch.Tensor | None, queries: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The RoPE rotations every block uses for this batch: the whole table for window
        positions, else each token's rotation at its position in its document; with `queries`,
        the rows of those window positions."""
        if self.args.rope_positions == "window":
            return self.freqs_cis if queries is None else self.freqs_cis[queries]
        if tokens is None:
            raise ValueError("document RoPE positions need `tokens` (the ids)")
        freqs = self.freqs_cis[document_positions(tokens, self.args.bos_id)]
        return freqs if queries is None else freqs[:, queries]

    def forward(
        self,
        x: torch.Tensor,
        tokens: torch.Tensor | None = None,
        positions: Positions | None = None,
    ) -> torch.Tensor:
        """`x`: token ids (batch, seq) -> logits. `tokens`, when given, are the ids of the whole
        window the attention mask and positions are made from (by default `x`): a copy that
        lacks some parts (a pipeline stage) starts from hidden states when it has no
        `tok_embeddings`, and returns hidden states when it has no `output`. `positions`
        (query positions, key positions): `x` holds the window's tokens at those query
        positions, and the attention kernel supplies the keys at those key positions (context
        parallel passes both)."""
        if tokens is None and self.tok_embeddings is not None:
            tokens = x
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        # Built here, once, rather than in each block: under activation checkpointing and
        # compile the blocks receive them as inputs and never rebuild them. Under tensor
        # parallel `tokens` is still whole and the same on every rank (the embedding shards
        # its output), so every rank computes the same positions.
        if tokens is not None:
            mask = self.attention_mask(tokens, positions, dtype=h.dtype)
        else:
            mask = self._mask_without_ids()
        freqs = self.rope_freqs(tokens, positions[0] if positions is not None else None)
        for layer in self.layers.values():
            h = layer(h, freqs, mask)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h

    def _mask_without_ids(self) -> AttentionMask:
        if self.args.attn_mask_type != "causal" or self.args.attn_type == "flex":
            raise ValueError("a model without tok_embeddings needs `tokens` for its attention mask")
        return None

    @torch.no_grad()
    def init_weights(self, seed: int, buffer_device: torch.device | None = None) -> None:
        """Fill every parameter from (seed, parameter name, element index) alone, so the full
        weights are the same whatever the device, dtype of the run or parallel layout."""
        device = buffer_device or self.freqs_cis.device
        self.freqs_cis = rope_frequencies(self.args, self.args.max_seq_len, device)
        # A pipeline stage lacks some parts; the names (and so the values) of the rest are the
        # whole model's.
        if self.tok_embeddings is not None:
            fill_trunc_normal_(self.tok_embeddings.weight, 1.0, seed, "tok_embeddings", cutoff=None)
        for i, layer in self.layers.items():
            cast(TransformerBlock, layer).init_weights(f"layers.{i}", seed)
        if self.norm is not None:
            self.norm.init_weights()
        if self.output is not None:
            std = self.args.dim**-0.5
            fill_trunc_normal_(self.output.weight, std, seed, "output", cutoff=3 * std)
