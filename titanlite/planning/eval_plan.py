"""The dry run's line on [eval]: its forward passes per evaluation and their compute next to a
training step's (the tasks' requests counted from their files when they are here)."""

from __future__ import annotations

import math

from titanlite.config.schema import JobConfig
from titanlite.evals import TaskError, load_task


def eval_cost(job: JobConfig, dp_size: int, grad_accum_steps: int, flops_per_step: float) -> str:
    """'' when [eval] is off."""
    if not job.eval.enabled:
        return ""
    t = job.training
    try:
        tasks = [load_task(spec, job.eval.limit) for spec in job.eval.tasks]
    except TaskError:
        return f"eval                 {len(job.eval.tasks)} task(s) not readable here: not planned"
    requests = sum(len(e.choices) for task in tasks for e in task.examples)
    forwards = math.ceil(math.ceil(requests / dp_size) / t.local_batch_size)
    # Rows of at most seq_len tokens, as many per forward as a micro-batch; a forward is a third
    # of a micro-batch's training FLOPs.
    steps = forwards / (3 * grad_accum_steps)
    return (
        f"eval                 {requests:,} requests of {len(tasks)} task(s) every "
        f"{job.eval.interval} steps: {forwards} forward(s) of {t.local_batch_size} x "
        f"{t.seq_len} tokens (at most) per rank, the compute of ~{steps:.2f} training steps "
        f"({flops_per_step * steps:.2e} FLOPs)"
    )
