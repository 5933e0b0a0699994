"""Qwen3 (dense), as Hugging Face's `Qwen3ForCausalLM`: grouped-query attention whose head_dim
is its own (not dim / n_heads), queries and keys RMS-normalized per head before RoPE (θ 1e6),
SwiGLU, no biases, and for the small flavors an output head that is the embedding.

The blocks are `models.decoder.DecoderBlock`s with the shared attention (`q_norm`, `k_norm`) and
feed-forward; in the MoE flavors a Mixture-of-Experts layer (models/moe.py) takes the
feed-forward's place in every block. Masks, RoPE positions and the forward are `models.decoder.Decoder`'s.

Tied embeddings: `output.weight` is `tok_embeddings.weight`, one parameter. The model's state
dict holds it once, under `tok_embeddings.weight` (as Hugging Face's safetensors hold only
`embed_tokens`), so checkpoints, the Hugging Face adapter and the optimizer see one tensor.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from models.decoder import Decoder, DecoderBlock, depth_out_std
from models.initialization import fill_trunc_normal_
from models.layers import Attention, FeedForward, inverse_frequencies, rotations
from models.moe import MoE
from models.qwen3.args import Qwen3Args

TIED_KEY = "output.weight"  # the state-dict key a tied head does not have


def _block(layer_id: int, args: Qwen3Args) -> DecoderBlock:
    attention = Attention(args.dim, args.n_heads, args.kv_heads, args.head_dim, args.norm_eps)
    moe = args.moe
    feed_forward = FeedForward(args.dim, args.ffn_hidden_dim) if moe is None else MoE(args.dim, moe)
    return DecoderBlock(
        attention,
        feed_forward,
        args.dim,
        args.norm_eps,
        depth_out_std(layer_id, args.n_layers, args.depth_init),
    )


class Qwen3(Decoder):
    def __init__(self, args: Qwen3Args):
        super().__init__(args, lambda i: _block(i, args))
        if args.tie_word_embeddings:
            self.tie_weights()
            self.register_state_dict_post_hook(_drop_tied_key)
            self.register_load_state_dict_post_hook(_tied_key_is_not_missing)

    def tie_weights(self) -> None:
        """Make the output head the embedding again: tensor parallel replaces each end's
        parameter with its own DTensor, and `to_empty` (meta -> device) gives each module its own
        tensor. Absent parts (a pipeline stage) are left alone."""
        if self.output is not None and self.tok_embeddings is not None:
            if self.output.weight is not self.tok_embeddings.weight:
                self.output.weight = self.tok_embeddings.weight

    def rope_table(self, device: torch.device | None) -> torch.Tensor:
        a = self.args
        return rotations(inverse_frequencies(a.head_dim, a.rope_theta, device), a.max_seq_len)

    @torch.no_grad()
    def init_weights(self, seed: int, buffer_device: torch.device | None = None) -> None:
        if self.args.tie_word_embeddings:
            self.tie_weights()  # every build calls this after to_empty
        super().init_weights(seed, buffer_device)
        if self.args.tie_word_embeddings and self.tok_embeddings is not None:
            # One tensor serves both ends: the head's scale (an embedding of std 1 would give
            # logits of std sqrt(dim)).
            std = self.args.dim**-0.5
            fill_trunc_normal_(self.tok_embeddings.weight, std, seed, "output", cutoff=3 * std)


def _drop_tied_key(module: nn.Module, state_dict: dict[str, Any], prefix: str, _meta) -> None:
    state_dict.pop(prefix + TIED_KEY, None)


def _tied_key_is_not_missing(module: nn.Module, keys) -> None:
    for key in [k for k in keys.missing_keys if k.endswith(TIED_KEY)]:
        keys.missing_keys.remove(key)
