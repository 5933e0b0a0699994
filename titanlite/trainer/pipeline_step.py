"""One accumulation micro-batch through the pipeline schedule: the trainer's forward + backward
when pipeline parallel is on.

The schedule splits the rank's local batch into pipeline micro-batches, runs them through this
rank's stages and calls the loss on the last stage; `scale_grads=False` leaves the loss as the
trainer made it (a sum over counted targets times 1 / their global number), so no micro-batch
count divides it a second time. Every stage is given the token ids as well (`tokens=`): a later
stage receives hidden states, but builds its attention mask from the ids.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from parallelisms.options import PipelineOptions
from parallelisms.pipeline import build_schedule
from titanlite.build.assemble import BuiltModel
from titanlite.components.loss import cross_entropy_rows


class PipelineStep:
    def __init__(
        self,
        built: BuiltModel,
        pp_group_mesh,
        device: torch.device,
        local_batch_size: int,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        opts: PipelineOptions,
    ):
        self.scale: torch.Tensor | float = 1.0
        self.device = device
        self.pp_group = pp_group_mesh.get_group()
        self.has_first = 0 in built.stage_ids
        self.has_last = built.num_stages - 1 in built.stage_ids

        # Downstream evaluation's forwards give each row's loss sum instead (the schedule only
        # collects what the loss returns when nothing runs backward).
        self.rows = False

        def scaled_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            if self.rows:
                return cross_entropy_rows(logits, labels)
            return loss_fn(logits, labels) * self.scale

        self.schedule = build_schedule(
            built.parts,
            built.stage_ids,
            built.num_stages,
            pp_group_mesh,
            device,
            local_batch_size // opts.microbatch_size,
            scaled_loss,
            opts,
        )

    def __call__(
        self,
        inputs: torch.Tensor,
        labels: torch.Tensor,
        scale: torch.Tensor,
        tokens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Forward and backward of one accumulation micro-batch; this rank's loss (non-zero on
        the last stage only). `tokens`: the whole window when `inputs` is a part of it (context
        parallel)."""
        self.scale = scale
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.has_first else ()
        tokens = inputs if tokens is None else tokens
        self.schedule.step(*args, tokens=tokens, target=labels, losses=losses, return_outputs=False)
        return _sum(losses, self.device).detach()

    def evaluate(
        self, inputs: torch.Tensor, labels: torch.Tensor, tokens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Forward only (validation): the batch's loss sum, on every stage."""
        self.scale = 1.0
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.has_first else ()
        tokens = inputs if tokens is None else tokens
        self.schedule.eval(*args, tokens=tokens, target=labels, losses=losses)
        return self.share_loss(_sum(losses, self.device))

    def evaluate_rows(
        self, inputs: torch.Tensor, labels: torch.Tensor, tokens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Forward only (downstream evaluation): each row's loss sum, (batch,), on every
        stage. The last stage's micro-batches come back in order."""
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.has_first else ()
        tokens = inputs if tokens is None else tokens
        self.rows = True
        try:
            self.schedule.eval(*args, tokens=tokens, target=labels, losses=losses)
        finally:
            self.rows = False
        rows = torch.zeros(labels.shape[0], device=self.device)
        if losses:
            rows = torch.cat([_full(loss) for loss in losses])
        return self.share_loss(rows)

    def share_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss, known to the last stage only, on every stage (one all-reduce over pp)."""
        loss = loss.clone()
        dist.all_reduce(loss, group=self.pp_group)
        return loss


def _sum(losses: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The micro-batches' losses (vocab-sharded DTensors under loss parallel) as one number."""
    total = torch.zeros((), device=device)
    for loss in losses:
        total += _full(loss)
    return total


def _full(loss: torch.Tensor) -> torch.Tensor:
    return loss.full_tensor() if isinstance(loss, DTensor) else loss
