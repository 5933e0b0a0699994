"""Downstream evaluation in the loop: every request of every [eval] task scored by the model as it
is, on every rank of the layout it trains on.

A request (context + one choice, tokenized as lm-eval-harness does: titanlite/evals) is one row
of a batch of the training's shape (local_batch_size x seq_len, padded), so every layout runs
the forward it already runs for validation: FSDP, TP, EP and compiled models unchanged, context
parallel on its part of each row, pipeline parallel through its schedule. Only the row's
continuation tokens are targets; the loss's per-row sum is minus the request's log-likelihood.
Rows are dealt round-robin over the data-parallel ranks; each rank writes its rows'
log-likelihoods into a vector of every request (context-parallel ranks each their part), and
one sum over the data- and context-parallel ranks gives every rank all of them. The model is in
eval mode and without gradients (MoE load statistics and the expert bias do not move).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from parallelisms.context_parallel import SequenceShards
from parallelisms.tensor_parallel import loss_context
from titanlite.components.loss import IGNORE_INDEX, local_batch
from titanlite.config.schema import Eval
from titanlite.core.logging import logger
from titanlite.evals import Request, score
from titanlite.preflight.evals import EvalTask

# A long evaluation says how far it has got at most this often (seconds).
PROGRESS_EVERY_S = 30.0
# forward_rows(inputs, labels, tokens) -> each row's summed cross-entropy, (batch,) on every rank.
RowLosses = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


def request_rows(
    requests: Sequence[Request], rows: int, seq_len: int, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels) of `rows` rows, one per request first: inputs its tokens but the last,
    labels the next tokens where they are the continuation's and IGNORE_INDEX elsewhere
    (padding, and the rows past the requests, included)."""
    inputs = torch.full((rows, seq_len), pad_id, dtype=torch.long)
    labels = torch.full((rows, seq_len), IGNORE_INDEX, dtype=torch.long)
    for row, r in enumerate(requests):
        tokens = torch.tensor(r.tokens, dtype=torch.long)
        n = len(tokens) - 1
        inputs[row, :n] = tokens[:-1]
        labels[row, n - r.continuation : n] = tokens[-r.continuation :]
    return inputs, labels


class Evaluator:
    def __init__(
        self,
        cfg: Eval,
        tasks: dict[str, EvalTask],
        forward_rows: RowLosses,
        modules: Sequence[nn.Module],
        device: torch.device,
        local_batch_size: int,
        seq_len: int,
        pad_id: int,
        dp_rank: int,
        dp_size: int,
        global_sum: Callable[[torch.Tensor], torch.Tensor],
        loss_parallel: bool,
        amp: contextlib.AbstractContextManager,
        sequence_shards: SequenceShards | None = None,
        fixed_shape: bool = True,
        samples_folder: Path | None = None,
    ):
        """`modules`: what runs (the model, or this rank's pipeline stages), put in eval mode
        for the forwards. `fixed_shape`: rows as long as the training's (a pipeline schedule,
        a compiled model and context parallel's shards take that shape); otherwise as long as
        the longest request. `samples_folder`: where this rank writes each request's
        log-likelihood (eval.log_samples, rank 0); None: nowhere."""
        self.samples_folder = samples_folder
        self.cfg, self.tasks, self.forward_rows, self.modules = cfg, tasks, forward_rows, modules
        self.device, self.batch, self.seq_len, self.pad_id = (
            device,
            local_batch_size,
            seq_len,
            pad_id,
        )
        self.dp_rank, self.dp_size, self.global_sum = dp_rank, dp_size, global_sum
        self.loss_parallel, self.amp, self.sequence_shards = loss_parallel, amp, sequence_shards
        self.requests = [r for t in tasks.values() for r in t.requests]
        if not fixed_shape:
            self.seq_len = max(len(r.tokens) - 1 for r in self.requests)
        # Every rank runs the same number of forwards (FSDP's collectives), padded rows last.
        per_rank = math.ceil(len(self.requests) / dp_size)
        self.forwards = math.ceil(per_rank / local_batch_size)

    def due(self, step: int, total_steps: int) -> bool:
        return step % self.cfg.interval == 0 or step == total_steps

    def describe(self) -> str:
        names = ", ".join(f"{n} ({len(t.task.examples)} examples)" for n, t in self.tasks.items())
        return (
            f"eval: {names}: {len(self.requests)} requests, {self.forwards} forward(s) of "
            f"{self.batch} x {self.seq_len} tokens per rank every {self.cfg.interval} steps"
        )

    def loglikelihoods(self) -> list[float]:
        """Every request's log-likelihood, on every rank."""
        total = torch.zeros(len(self.requests), dtype=torch.float64, device=self.device)
        mine = list(range(self.dp_rank, len(self.requests), self.dp_size))
        modes = [m.training for m in self.modules]
        for m in self.modules:
            m.eval()
        start = last_said = time.perf_counter()
        try:
            with torch.no_grad():
                for f in range(self.forwards):
                    rows = mine[f * self.batch : (f + 1) * self.batch]
                    sums = self._forward([self.requests[i] for i in rows])
                    total[rows] -= sums[: len(rows)].double()
                    now = time.perf_counter()
                    if now - last_said >= PROGRESS_EVERY_S and f + 1 < self.forwards:
                        logger.info(
                            f"eval: {f + 1} of {self.forwards} forwards per rank done "
                            f"({now - start:.0f}s)"
                        )
                        last_said = now
        finally:
            for m, mode in zip(self.modules, modes):
                m.train(mode)
        return self.global_sum(total).tolist()

    def _forward(self, requests: list[Request]) -> torch.Tensor:
        # A rank's last batch is topped up with rows that count no target.
        inputs, labels = request_rows(requests, self.batch, self.seq_len, self.pad_id)
        inputs, labels = inputs.to(self.device), labels.to(self.device)
        inputs, tokens, labels = local_batch(self.sequence_shards, inputs, labels)
        with loss_context(self.loss_parallel), self.amp:
            return self.forward_rows(inputs, labels, tokens)

    def run(self, step: int) -> dict[str, float]:
        """eval/<task>/acc, acc_norm and their standard errors, and eval_time_s."""
        start = time.perf_counter()
        lls = self.loglikelihoods()
        results: dict[str, float] = {}
        at = 0
        for name, t in self.tasks.items():
            scores = score(t.task, lls[at : at + len(t.requests)])
            at += len(t.requests)
            results.update({f"eval/{name}/{k}": v for k, v in scores.items()})
            if self.samples_folder is not None:
                self._write_samples(step, name, t, lls[at - len(t.requests) : at])
            logger.info(
                f"eval step {step}: {name} acc {scores['acc']:.4f} "
                f"(+-{scores['acc_stderr']:.4f})  acc_norm {scores['acc_norm']:.4f} "
                f"(+-{scores['acc_norm_stderr']:.4f})  {len(t.task.examples)} examples"
            )
        results["eval_time_s"] = time.perf_counter() - start
        logger.info(
            f"eval step {step}: {len(lls)} requests in {self.forwards} forward(s) per rank, "
            f"{results['eval_time_s']:.1f}s"
        )
        return results

    def _write_samples(self, step: int, name: str, t: EvalTask, lls: list[float]) -> None:
        """One line per request; an earlier file of the same step (a rerun after a resume) is
        kept, the new one numbered after it."""
        assert self.samples_folder is not None
        folder = self.samples_folder / f"step-{step}"
        folder.mkdir(parents=True, exist_ok=True)
        path, n = folder / f"{name}.jsonl", 1
        while path.exists():
            n += 1
            path = folder / f"{name}-{n}.jsonl"
        lines = [
            json.dumps(
                {
                    "example": r.example,
                    "choice": r.choice,
                    "gold": t.task.examples[r.example].gold,
                    "loglikelihood": ll,
                    "tokens": len(r.tokens),
                    "continuation_tokens": r.continuation,
                }
            )
            for r, ll in zip(t.requests, lls)
        ]
        path.write_text("\n".join(lines) + "\n")
