"""One optimizer step: zero_grad, forward and backward per accumulation micro-batch, clip, the
non-finite guard, optimizer and LR step. `TrainStep` runs the model itself; `PipelineTrainStep`
runs each micro-batch through the pipeline schedule (`PipelineStep`). The trainer picks one when
it builds and the loop calls whichever it got.

Every counted target of the global batch weighs 1 / (their global number). Gradients are
averaged over the ranks holding different tokens (FSDP over dp_shard x cp, DDP), hence the
factor `loss_ranks`.

Multi-token prediction (a model with `mtp_targets`, DeepSeek-V3): each depth's targets are
counted globally as the main ones are (one collective for all), each depth's loss is its mean
over them, and the objective adds `mtp_loss_weight` x the mean over depths (DeepSeek-V3's
lambda / D x sum_k L_k), logged apart as `loss_mtp`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from models.moe import finish_step, moe_layers
from parallelisms.context_parallel import SequenceShards
from parallelisms.tensor_parallel import loss_context
from titanlite.components.loss import (
    IGNORE_INDEX,
    LocalBatch,
    cross_entropy_rows,
    local_batch,
    model_kwargs,
)
from titanlite.components.nonfinite import NonFiniteGuard
from titanlite.components.optim import clip_grad_norm_
from titanlite.trainer.pipeline_step import PipelineStep

Microbatch = tuple[torch.Tensor, torch.Tensor]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class StepOutput(NamedTuple):
    loss: torch.Tensor  # this rank's share: the mean over data-parallel ranks is the step's loss
    grad_norm: torch.Tensor
    lr: float  # the LR the step used
    mtp_loss: torch.Tensor | None = None  # as `loss`, the MTP depths' mean; None without MTP


class TrainStep:
    pp_group: dist.ProcessGroup | None = None  # the stages' group, for clipping and metrics
    # Validation's forward (inputs, labels, tokens) -> loss sum; None: the model's own.
    eval_loss: Callable[..., torch.Tensor] | None = None

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        lr_scheduler,
        loss_fn: LossFn,
        *,
        step: Callable[[], int],
        device: torch.device,
        amp: contextlib.AbstractContextManager,
        loss_parallel: bool,
        sequence_shards: SequenceShards | None,
        loss_ranks: int,
        global_sum: Callable[[torch.Tensor], torch.Tensor],
        max_norm: float,
        nonfinite: NonFiniteGuard,
        sync_last_microbatch_only: bool = False,
        expert_load_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        """`step()`: the step being trained (for the non-finite guard's messages);
        `sync_last_microbatch_only`: FSDP reduce-scatters once per step, after the last
        micro-batch, instead of once per micro-batch (for more memory); `expert_load_sum`: the
        tokens-per-expert counts' sum over every rank that routed other tokens (`global_sum`
        unless given)."""
        self.model, self.optimizer, self.lr_scheduler = model, optimizer, lr_scheduler
        self.loss_fn, self.step, self.device, self.amp = loss_fn, step, device, amp
        self.loss_parallel, self.sequence_shards = loss_parallel, sequence_shards
        self.loss_ranks, self.global_sum = loss_ranks, global_sum
        self.max_norm, self.nonfinite = max_norm, nonfinite
        self.sync_last_microbatch_only = sync_last_microbatch_only
        self.params = [q for q in model.parameters() if q.requires_grad]
        self.has_moe = any(True for _ in moe_layers(model))
        self.expert_load_sum = expert_load_sum or global_sum
        # A family with multi-token prediction: labels -> each depth's targets.
        self.mtp_targets: Callable[[torch.Tensor], list[torch.Tensor]] | None = getattr(
            model, "mtp_targets", None
        )
        self.mtp_weight = float(getattr(getattr(model, "args", None), "mtp_loss_weight", 0.0))

    def __call__(self, microbatches: list[Microbatch]) -> StepOutput:
        self.optimizer.zero_grad(set_to_none=True)
        batches = [local_batch(self.sequence_shards, x, y) for x, y in microbatches]
        targets = [
            [labels, *self._rank_mtp_targets(y)]
            for (_, y), (*_, labels) in zip(microbatches, batches)
        ]
        counted = torch.stack(
            [sum((t != IGNORE_INDEX).sum() for t in depth) for depth in zip(*targets)]
        )
        # Device tensors, never read by the host: the step runs without a device sync.
        scales = self.loss_ranks / self.global_sum(counted).clamp_min(1)
        loss_sum = torch.zeros((), device=self.device)
        mtp_sum = torch.zeros((), device=self.device) if len(scales) > 1 else None
        for i, (batch, batch_targets) in enumerate(zip(batches, targets)):
            last = i == len(batches) - 1
            if mtp_sum is None:
                loss_sum += self.forward_backward(batch, scales[0], last=last)
            else:
                loss, mtp = self.forward_backward_mtp(batch, batch_targets[1:], scales, last)
                loss_sum += loss
                mtp_sum += mtp
        loss_sum = self.share_loss(loss_sum)
        grad_norm = clip_grad_norm_(self.params, self.max_norm, pp_group=self.pp_group)
        if self.has_moe:  # the step's expert load over data-parallel ranks; the expert bias
            finish_step(self.model, self.expert_load_sum)
        lr = float(self.lr_scheduler.get_last_lr()[0])
        self.nonfinite.step_optimizer(self.optimizer, self.step(), grad_norm)
        self.lr_scheduler.step()
        return StepOutput(loss_sum, grad_norm, lr, mtp_sum)

    def _rank_mtp_targets(self, labels: torch.Tensor) -> list[torch.Tensor]:
        """Each MTP depth's targets of this rank: shifted in the whole window, then cut as the
        labels are under context parallel (a position's target k ahead may be another rank's)."""
        if self.mtp_targets is None:
            return []
        shards = self.sequence_shards
        return [t if shards is None else shards.shard(t) for t in self.mtp_targets(labels)]

    def forward_backward(self, batch: LocalBatch, scale: torch.Tensor, last: bool) -> torch.Tensor:
        """One accumulation micro-batch; its scaled loss, detached."""
        inputs, tokens, labels = batch
        if self.sync_last_microbatch_only:
            cast(FSDPModule, self.model).set_requires_gradient_sync(last)
        with loss_context(self.loss_parallel):
            with self.amp:
                # No name holds the logits: autograd keeps only the loss's float32 log-softmax,
                # so the compute-dtype logits are freed before backward (2 bytes per token x
                # vocabulary entry in bf16; scripts/loss_memory.py measures the region).
                loss = self.loss_fn(self.model(inputs, **model_kwargs(tokens)), labels) * scale
            loss.backward()
        return _detached(loss)

    def forward_backward_mtp(
        self,
        batch: LocalBatch,
        mtp_targets: list[torch.Tensor],
        scales: torch.Tensor,
        last: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward_backward` of a model with MTP modules: (the main loss, the depths' mean
        loss), each scaled, detached."""
        inputs, tokens, labels = batch
        if self.sync_last_microbatch_only:
            cast(FSDPModule, self.model).set_requires_gradient_sync(last)
        model = cast(Any, self.model)
        with loss_context(self.loss_parallel):
            with self.amp:
                logits = model(inputs, **model_kwargs(tokens), mtp_targets=mtp_targets)
                loss = self.loss_fn(logits, labels) * scales[0]
                del logits
                sums: list[torch.Tensor] = model.mtp_loss_sums
                model.mtp_loss_sums = []
                mtp = torch.stack([s * c for s, c in zip(sums, scales[1:])]).mean()
            (loss + self.mtp_weight * mtp).backward()
        return _detached(loss), _detached(mtp)

    def share_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss

    def row_losses(
        self, inputs: torch.Tensor, labels: torch.Tensor, tokens: torch.Tensor | None
    ) -> torch.Tensor:
        """Downstream evaluation's forward: each row's loss sum, (batch,), on every rank."""
        return _detached(cross_entropy_rows(self.model(inputs, **model_kwargs(tokens)), labels))


def _detached(loss: torch.Tensor) -> torch.Tensor:
    return (loss.full_tensor() if isinstance(loss, DTensor) else loss).detach()


class PipelineTrainStep(TrainStep):
    """The same step with each micro-batch through this rank's pipeline stages."""

    def __init__(self, pipeline: PipelineStep, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pipeline = pipeline
        self.pp_group = pipeline.pp_group
        self.eval_loss = pipeline.evaluate

    def forward_backward(self, batch: LocalBatch, scale: torch.Tensor, last: bool) -> torch.Tensor:
        inputs, tokens, labels = batch
        with loss_context(self.loss_parallel), self.amp:
            return self.pipeline(inputs, labels, scale, tokens)

    def share_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return self.pipeline.share_loss(loss)

    def row_losses(
        self, inputs: torch.Tensor, labels: torch.Tensor, tokens: torch.Tensor | None
    ) -> torch.Tensor:
        return self.pipeline.evaluate_rows(inputs, labels, tokens)
