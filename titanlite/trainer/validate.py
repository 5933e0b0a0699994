"""The validation loss: held-out windows through the same parallelized model, without gradients.

Every rank sees the same held-out window stream, unshuffled (the text files in sorted order, or
the prepared shards in manifest order), and reads its part of each global batch by the training
rule (`RankSplit`). The result is the mean over every counted target of every batch on every
data-parallel rank (as in training, the targets after an EOS are not counted under
block_causal), so it is the same number under every parallel layout with the same global batch.
Text is tokenized once, at start, and kept in memory (held-out sets are small; prepare a large
one as shards, which are memory-mapped).

Named held-out sets ([[validation.sources]]) each give their own loss, val_loss_<name>, and
val_loss is then the loss over all of their counted targets together (so a large set weighs
more than a small one, as one set made of both would).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import nn
from torch.distributed.tensor import DTensor

from parallelisms.context_parallel import SequenceShards
from parallelisms.tensor_parallel import loss_context
from titanlite.components.loss import (
    IGNORE_INDEX,
    ignore_boundary_targets,
    local_batch,
    model_kwargs,
)
from titanlite.config.schema import Validation
from titanlite.core.logging import logger
from titanlite.data import DatasetError, DataSource, ShardSet, Tokenizer
from titanlite.data.rank_split import RankSplit
from titanlite.data.text_dataset import read_stream


class ValidationData:
    """The held-out windows of one rank, batch by batch."""

    def __init__(
        self,
        source: DataSource,
        tokenizer: Tokenizer,
        seq_len: int,
        local_batch_size: int,
        dp_rank: int,
        dp_size: int,
        steps: int,
        text_field: str = "text",
        key: str = "validation.dataset_path",
    ):
        """`key`: the config key of the set's path, which its errors name."""
        n = seq_len + 1
        if isinstance(source, ShardSet):
            windows = source.num_windows(seq_len)
            self._window = lambda w: source.window(w, seq_len)
        else:
            tokens = np.asarray(read_stream(source, tokenizer, text_field), dtype=np.int64)
            windows = len(tokens) // n
            table = tokens[: windows * n].reshape(windows, n)
            self._window = lambda w: table[w]
        self.split = RankSplit(local_batch_size, dp_rank, dp_size)
        available = windows // self.split.chunk
        if available == 0:
            raise DatasetError(
                f"{key} holds {windows} windows of seq_len + 1 = {n} tokens, fewer "
                f"than one global batch ({self.split.chunk}); give it more data or lower "
                "validation.local_batch_size"
            )
        if steps > available:
            logger.warning(
                f"validation.steps = {steps}, but {key} holds only "
                f"{available} global batches: validating on {available}"
            )
        self.steps = available if steps == -1 else min(steps, available)
        self.local_batch_size = local_batch_size

    def batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for step in range(self.steps):
            first = step * self.local_batch_size
            rows = [
                self._window(self.split.position(first + j)) for j in range(self.local_batch_size)
            ]
            t = torch.from_numpy(np.stack(rows).astype(np.int64))
            yield t[:, :-1], t[:, 1:]


class Validator:
    def __init__(
        self,
        cfg: Validation,
        data: dict[str, ValidationData],
        model: nn.Module,
        loss_fn: Callable,
        device: torch.device,
        loss_parallel: bool,
        amp: contextlib.AbstractContextManager,
        global_sum: Callable[[torch.Tensor], torch.Tensor],
        boundary_bos_id: int | None = None,
        forward_loss: Callable[..., torch.Tensor] | None = None,
        sequence_shards: SequenceShards | None = None,
    ):
        """`data`: the held-out sets by name ("": the one validation.dataset_path names).
        `loss_fn` sums over the counted targets; `boundary_bos_id`, when given, is the BOS
        whose targets are not counted (block_causal). `forward_loss(inputs, labels, tokens)`,
        when given, replaces `loss_fn(model(inputs, tokens=tokens), labels)` (pipeline
        parallel: the schedule runs the forward, and every stage gets the loss sum).
        `sequence_shards` cuts each batch to this rank's part under context parallel."""
        self.sequence_shards = sequence_shards
        self.cfg, self.data, self.model, self.loss_fn = cfg, data, model, loss_fn
        self.device, self.loss_parallel, self.amp = device, loss_parallel, amp
        self.global_sum, self.boundary_bos_id = global_sum, boundary_bos_id
        self.forward_loss = forward_loss or self._model_loss

    def _model_loss(
        self, inputs: torch.Tensor, labels: torch.Tensor, tokens: torch.Tensor | None
    ) -> torch.Tensor:
        loss = self.loss_fn(self.model(inputs, **model_kwargs(tokens)), labels)
        return loss.full_tensor() if isinstance(loss, DTensor) else loss

    def due(self, step: int, total_steps: int) -> bool:
        return step % self.cfg.freq == 0 or step == total_steps

    @torch.no_grad()
    def run(self) -> dict[str, float]:
        """val_loss, and val_loss_<name> for each named set; every rank gets the same."""
        # [loss sum, counted targets] per set: one all-reduce for all of them.
        totals = torch.stack([self._sums(data) for data in self.data.values()])
        sums = self.global_sum(totals).tolist()
        losses = {
            f"val_loss_{name}": loss / max(counted, 1)
            for name, (loss, counted) in zip(self.data, sums)
            if name
        }
        loss_sum, counted = (sum(column) for column in zip(*sums))
        return {"val_loss": loss_sum / max(counted, 1), **losses}

    def _sums(self, data: ValidationData) -> torch.Tensor:
        total = torch.zeros(2, dtype=torch.float64, device=self.device)
        for inputs, labels in data.batches():
            if self.boundary_bos_id is not None:
                labels = ignore_boundary_targets(labels, self.boundary_bos_id)
            inputs, labels = inputs.to(self.device), labels.to(self.device)
            inputs, tokens, labels = local_batch(self.sequence_shards, inputs, labels)
            with loss_context(self.loss_parallel), self.amp:
                total[0] += self.forward_loss(inputs, labels, tokens)
            total[1] += (labels != IGNORE_INDEX).sum()
        return total
