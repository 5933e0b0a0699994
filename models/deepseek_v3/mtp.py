"""Multi-token prediction (DeepSeek-V3, section 2.2): module k (1-based) sees, at position t,
the previous depth's hidden state of t and the embedding of the token k positions ahead, and
predicts the token after that one (k + 1 ahead of the input at t):

    h_k = block_k(eh_proj([enorm(embed(x_{t+k})), hnorm(h_{k-1})]))      h_0: the main model's
    logits_k = output(norm_k(h_k))                                       output, normalized

The embedding and the output head are the main model's (one parameter each). As Hugging Face's
`MtpLayer` (and vLLM's and Megatron's), the embedding comes first in eh_proj's input, and h_0 is
the main model's normalized final hidden state, the one its head reads.

Within a window: depth k's inputs are the window's tokens shifted k to the left, and its targets
the labels shifted k to the left; the last k positions of each sequence have no token to embed
nor a target, and get none (`mtp_targets`), as Megatron's rolled loss mask. A target the main
loss ignores (the first token of a document, under block_causal) stays ignored at every depth.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from models.initialization import fill_trunc_normal_
from models.layers import RMSNorm

IGNORE_INDEX = -100  # cross_entropy's default, as the trainer's labels use it


def shift_left(x: torch.Tensor, k: int, fill: int) -> torch.Tensor:
    """(batch, seq) -> the same shifted k positions to the left, the last k filled."""
    return F.pad(x[:, k:], (0, k), value=fill)


def mtp_targets(labels: torch.Tensor, depth: int) -> list[torch.Tensor]:
    """The targets of each MTP depth 1..depth for the main model's (batch, seq) labels."""
    return [shift_left(labels, k, IGNORE_INDEX) for k in range(1, depth + 1)]


class MTPModule(nn.Module):
    def __init__(self, dim: int, eps: float, block: nn.Module):
        super().__init__()
        self.enorm = RMSNorm(dim, eps)
        self.hnorm = RMSNorm(dim, eps)
        self.eh_proj = nn.Linear(2 * dim, dim, bias=False)
        self.block = block
        self.norm = RMSNorm(dim, eps)

    def forward(
        self, hidden: torch.Tensor, embedded: torch.Tensor, freqs: torch.Tensor, mask
    ) -> torch.Tensor:
        """The previous depth's hidden states and the embeddings of the tokens k ahead ->
        this depth's normalized hidden states (the head's input; the next depth's h)."""
        h = self.eh_proj(torch.cat([self.enorm(embedded), self.hnorm(hidden)], dim=-1))
        return self.norm(self.block(h, freqs, mask))

    def init_weights(self, key: str, seed: int) -> None:
        for norm in (self.enorm, self.hnorm, self.norm):
            norm.init_weights()
        fill_trunc_normal_(self.eh_proj.weight, 0.02, seed, f"{key}.eh_proj")
        cast(Any, self.block).init_weights(f"{key}.block", seed)
