"""The metrics line (console, metrics.jsonl, TensorBoard, W&B) when due, and the launch's
goodput at the end."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from models.moe import imbalance, moe_layers
from titanlite.components.metrics.logger import MetricsLogger
from titanlite.components.nonfinite import NonFiniteGuard
from titanlite.components.param_groups import plain_name
from titanlite.trainer.callbacks.base import Callback
from titanlite.trainer.train_step import StepOutput


class MetricsLogging(Callback):
    def __init__(
        self,
        metrics: MetricsLogger,
        global_mean: Callable[[torch.Tensor], float],
        nonfinite: NonFiniteGuard,
        step: Callable[[], int],
        extra: Callable[[], dict] = dict,
    ):
        """`step()`: the step reached (the resumed one when no step was trained); `extra()`:
        more figures for the record (the MoE layers')."""
        self.metrics, self.global_mean, self.nonfinite = metrics, global_mean, nonfinite
        self.step, self.extra = step, extra
        self.records: list[dict] = []  # what was logged, step by step

    def post_train_batch(
        self, step: int, out: StepOutput, validation: dict[str, float] | None
    ) -> None:
        self.metrics.count_step()
        # Reading the loss syncs with the device: only on the steps that log it. The non-finite
        # verdicts are read there too, first: a run past its allowed skips stops before it logs.
        if self.metrics.should_log(step) or validation is not None:
            self.nonfinite.settle()
            record = self.metrics.log(
                step,
                self.global_mean(out.loss),
                out.grad_norm.item(),
                out.lr,
                validation,
                skipped_steps=self.nonfinite.skipped,
                extra=self.extra() | self._mtp(out),
            )
            self.records.append(record)

    def _mtp(self, out: StepOutput) -> dict:
        return {} if out.mtp_loss is None else {"loss_mtp": self.global_mean(out.mtp_loss)}

    def post_train(self) -> None:
        self.metrics.log_goodput(self.step())


def moe_figures(
    model: nn.Module, global_mean: Callable[[torch.Tensor], float], pp_group=None
) -> dict:
    """Each MoE layer's max/mean tokens per expert in the last step (its load over every
    data-parallel rank), the largest of them, and the auxiliary loss's mean over layers and
    data-parallel ranks; with pipeline stages, every stage's layers. Collective (every rank of
    the step calls it) and host-reading: for the steps that log."""
    layers = [(plain_name(name), layer) for name, layer in moe_layers(model)]
    figures = {name: float(imbalance(layer.step_load)) for name, layer in layers}
    aux = [layer.last_aux_loss for _, layer in layers if layer.last_aux_loss is not None]
    aux_losses = [global_mean(torch.stack(aux).mean())] if aux else []
    if pp_group is not None:
        stages: list = [None] * dist.get_world_size(pp_group)
        dist.all_gather_object(stages, (figures, aux_losses), group=pp_group)
        figures = {k: v for stage_figures, _ in stages for k, v in stage_figures.items()}
        aux_losses = [a for _, stage_aux in stages for a in stage_aux]
    record: dict = {"moe_imbalance": figures, "moe_imbalance_max": max(figures.values())}
    if aux_losses:
        record["moe_aux_loss"] = sum(aux_losses) / len(aux_losses)
    return record
