"""Several training jobs, one after another, in one process group: torchrun, the torch imports
and gloo's connections are paid once per world size instead of once per job.

    torchrun --nproc_per_node N tests/distributed/trainer_jobs_worker.py JOBS.json

JOBS.json is a list of {"argv": [...], "out": PATH, "record": bool}. Each job goes the way
`python -m titanlite.train` goes (preflight, Trainer, the seed checkpoint or train(), close) on
the group this worker made, which the trainer therefore leaves alone. Rank 0 saves each job's
result to its "out" (torch.save): every step's loss and gradient norm, the step it resumed from
and, with "record", the full gradients of step 1 (after clipping, as the optimizer saw them) and
the full final weights, gathered from their shards and pipeline stages.

A job that fails ends the group (exit 1, its traceback on stderr): the jobs after it have no
result, which their tests report.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from titanlite.core import distributed
from titanlite.core.logging import init_logger
from titanlite.preflight import checks as preflight
from titanlite.trainer.trainer import Trainer


def _clean(name: str) -> str:
    return name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")


def full_tensors(model: torch.nn.Module, what: str) -> dict[str, torch.Tensor]:
    """Every parameter's (what="param") or gradient's (what="grad") full value on every rank,
    merged over pipeline stages. Collective: every rank calls it in step."""
    mine = {}
    for name, p in model.named_parameters():
        value = p if what == "param" else p.grad
        if value is None:
            continue
        full = value.full_tensor() if isinstance(value, DTensor) else value
        mine[_clean(name)] = full.detach().cpu().float().clone()
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    merged: dict[str, torch.Tensor] = {}
    for part in everyone:
        merged.update(part)
    return merged


class FirstStepGradients:
    """The trainer's own step, unchanged, that keeps the gradients its first call leaves."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer, self.step = trainer, trainer.train_step
        self.grads: dict[str, torch.Tensor] | None = None

    def __call__(self, microbatches):
        out = self.step(microbatches)
        if self.grads is None:
            self.grads = full_tensors(self.trainer.model, "grad")
        return out


def run_job(argv: list[str], record: bool) -> dict:
    job, pre = preflight.run(argv, dist.get_world_size())
    # What start-up may take (a first compile), not the training timeout a previous job set.
    distributed.set_timeout(job.comm.init_timeout_seconds)
    trainer = Trainer(job, pre)
    try:
        result: dict = {"resumed_from": trainer.checkpointer.resumed_from}
        if job.checkpoint.create_seed_checkpoint:
            trainer.save_seed_checkpoint()
            return result
        first = FirstStepGradients(trainer)
        if record:
            trainer.train_step = first  # type: ignore[assignment]
        records = trainer.train()
        result["losses"] = [r["loss"] for r in records]
        result["grad_norms"] = [r["grad_norm"] for r in records]
        if record:
            result["grads"] = first.grads
            result["weights"] = full_tensors(trainer.model, "param")
        return result
    finally:
        trainer.close()
        torch._dynamo.reset()  # each job compiles its own model


def main() -> None:
    init_logger()
    jobs = json.loads(open(sys.argv[1]).read())
    distributed.init(300)
    for spec in jobs:
        result = run_job(spec["argv"], spec.get("record", False))
        if dist.get_rank() == 0:
            torch.save(result, spec["out"])
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
