"""What every decoder-only family here shares: the pre-norm block (attention and feed-forward
modules given by the family, so a Mixture-of-Experts layer can take the feed-forward's place),
and the model around the blocks: embedding, the attention mask and RoPE rows built once per
forward, the blocks, final norm and output head.

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
The public structure the generic parallel code uses: `tok_embeddings`, `layers` (a ModuleDict by
layer number), `norm`, `output`, and each block's `attention.sdpa` kernel.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn
from torch.nn.attention.flex_attention import BlockMask

from models.attention import (
    ATTN_MASK_TYPES,
    ATTN_TYPES,
    AttentionMask,
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
from models.layers import RMSNorm

ROPE_POSITIONS = ("window", "document")

Positions = tuple[torch.Tensor, torch.Tensor]  # (query positions, key positions) in the window


def check_attention_args(args: Any) -> None:
    """The attention fields every family's args have (attn_type, attn_mask_type,
    rope_positions); ValueError names the first one that is wrong."""
    if args.attn_type not in ATTN_TYPES:
        raise ValueError(f"attn_type = {args.attn_type!r}: expected one of {ATTN_TYPES}")
    if args.attn_mask_type not in ATTN_MASK_TYPES:
        raise ValueError(
            f"attn_mask_type = {args.attn_mask_type!r}: expected one of {ATTN_MASK_TYPES}"
        )
    if args.rope_positions not in ROPE_POSITIONS:
        raise ValueError(
            f"rope_positions = {args.rope_positions!r}: expected one of {ROPE_POSITIONS}"
        )
    if args.rope_positions == "document" and args.attn_mask_type != "block_causal":
        raise ValueError(
            "rope_positions = 'document' needs attn_mask_type = 'block_causal' (with "
            f"{args.attn_mask_type!r} a token attends across documents whose positions "
            "restart); use rope_positions = 'window'"
        )


class DecoderBlock(nn.Module):
    """Pre-norm residual block: x + attention(norm(x)), then h + feed_forward(norm(h)). The
    attention takes (x, freqs, mask); the feed-forward takes x; both have
    `init_weights(key, seed, out_std)`."""

    def __init__(
        self, attention: nn.Module, feed_forward: nn.Module, dim: int, eps: float, out_std: float
    ):
        super().__init__()
        self.attention_norm = RMSNorm(dim, eps)
        self.attention = attention
        self.ffn_norm = RMSNorm(dim, eps)
        self.feed_forward = feed_forward
        self.out_std = out_std

    def forward(
        self, x: torch.Tensor, freqs: torch.Tensor, mask: AttentionMask = None
    ) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs, mask)
        return h + self.feed_forward(self.ffn_norm(h))

    def init_weights(self, key: str, seed: int) -> None:
        self.attention_norm.init_weights()
        self.ffn_norm.init_weights()
        for name in ("attention", "feed_forward"):
            cast(Any, getattr(self, name)).init_weights(f"{key}.{name}", seed, self.out_std)


def depth_out_std(layer_id: int, n_layers: int, depth_init: bool) -> float:
    """The init std of a block's output projections, scaled by depth (GPT-2 / TorchTitan)."""
    depth = layer_id + 1 if depth_init else n_layers
    return 0.02 / (2 * depth) ** 0.5


class Decoder(nn.Module):
    """Embedding -> blocks -> final norm -> output head. A family builds its blocks
    (`make_block(layer_id)`) and says how its RoPE table is made (`rope_table`); the args need
    `dim`, `n_layers`, `vocab_size`, `norm_eps`, `max_seq_len`, `bos_id` and the attention
    fields of `check_attention_args`."""

    freqs_cis: torch.Tensor

    def __init__(self, args: Any, make_block: Any):
        super().__init__()
        args.check()
        self.args = args
        # Optional: a pipeline stage is a copy without the parts other stages own.
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(args.vocab_size, args.dim)
        # A dict keyed by the layer number keeps checkpoint keys stable if layers are dropped
        # or moved (as pipeline stages do).
        self.layers = nn.ModuleDict({str(i): make_block(i) for i in range(args.n_layers)})
        self.norm: RMSNorm | None = RMSNorm(args.dim, args.norm_eps)
        self.output: nn.Linear | None = nn.Linear(args.dim, args.vocab_size, bias=False)
        # Not persistent: derived from args, so checkpoints need not carry it.
        self.register_buffer("freqs_cis", self.rope_table(None), persistent=False)
        self._causal_block_masks: dict[tuple[int, int, torch.device], BlockMask] = {}

    def rope_table(self, device: torch.device | None) -> torch.Tensor:
        """The RoPE rotations of positions < args.max_seq_len, (max_seq_len, head_dim/2)."""
        raise NotImplementedError

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
        h, _ = self.hidden_states(x, tokens, positions)
        return self.output(h) if self.output is not None else h

    def hidden_states(
        self, x: torch.Tensor, tokens: torch.Tensor | None, positions: Positions | None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, AttentionMask]]:
        """`forward` up to the output head: the final norm's output (the last block's, in a
        pipeline stage without the norm), and the (RoPE rows, mask) the blocks used."""
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
        return h, (freqs, mask)

    def _mask_without_ids(self) -> AttentionMask:
        if self.args.attn_mask_type != "causal" or self.args.attn_type == "flex":
            raise ValueError("a model without tok_embeddings needs `tokens` for its attention mask")
        return None

    @torch.no_grad()
    def init_weights(self, seed: int, buffer_device: torch.device | None = None) -> None:
        """Fill every parameter from (seed, parameter name, element index) alone, so the full
        weights are the same whatever the device, dtype of the run or parallel layout."""
        self.freqs_cis = self.rope_table(buffer_device or self.freqs_cis.device)
        # A pipeline stage lacks some parts; the names (and so the values) of the rest are the
        # whole model's.
        if self.tok_embeddings is not None:
            fill_trunc_normal_(self.tok_embeddings.weight, 1.0, seed, "tok_embeddings", cutoff=None)
        for i, layer in self.layers.items():
            cast(DecoderBlock, layer).init_weights(f"layers.{i}", seed)
        if self.norm is not None:
            self.norm.init_weights()
        if self.output is not None:
            std = self.args.dim**-0.5
            fill_trunc_normal_(self.output.weight, std, seed, "output", cutoff=3 * std)
