"""The loss and what it is computed on: cross-entropy in float32 summed over the counted targets
(each counted token weighs the same however the global batch is split), the targets that get no
loss, and this rank's part of a batch under context parallel."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from parallelisms.context_parallel import SequenceShards

IGNORE_INDEX = -100  # a label that gets no loss (cross_entropy's default ignore_index)


def cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed over the counted targets: the trainer divides by the count over every data-parallel
    rank and micro-batch, so that each counted token weighs the same however the global batch
    is split (a mean per micro-batch would weigh tokens by how few others their micro-batch
    counts). Works on vocab-sharded DTensor logits under loss parallel too."""
    # In float32 whatever the compute dtype: a bf16 log-softmax over 128K classes loses bits.
    return F.cross_entropy(
        logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
    )


def cross_entropy_rows(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Each row's cross-entropy summed over its counted targets, (batch,): minus the row's
    log-likelihood (downstream evaluation). In float32, under loss parallel too (its
    vocab-sharded log-softmax takes reduction="none")."""
    per_token = F.cross_entropy(
        logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
    )
    return per_token.view(labels.shape).sum(-1)


def cross_entropy_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean over the counted targets of one batch (tools and tests; the trainer sums)."""
    return F.cross_entropy(
        logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX
    )


def ignore_boundary_targets(labels: torch.Tensor, bos_id: int) -> torch.Tensor:
    """Labels with the first token of each document ignored: predicting it would mean predicting
    across the boundary from the previous document, which block_causal attention cannot see.
    Documents are framed BOS ... EOS by both readers, so these are the targets after each EOS."""
    return labels.masked_fill(labels == bos_id, IGNORE_INDEX)


LocalBatch = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]


def local_batch(
    shards: SequenceShards | None, inputs: torch.Tensor, labels: torch.Tensor
) -> LocalBatch:
    """(model input, the window for the model's `tokens=`, labels) of this rank: under context
    parallel its part of each sequence, with the whole window for the mask and positions."""
    if shards is None:
        return inputs, None, labels
    return shards.shard(inputs), inputs, shards.shard(labels)


def model_kwargs(tokens: torch.Tensor | None) -> dict:
    """The model's `tokens=` when its input is a part of the window (context parallel)."""
    return {} if tokens is None else {"tokens": tokens}
