"""Several training jobs, one after another, in one process group: the processes, their torch
imports and gloo's connections are paid once per world size instead of once per job.

    group = TrainerJobs(nproc, folder)
    group.add("fsdp2", argv, record=True)   # its dump folder: folder/fsdp2
    group.run()
    group.result("fsdp2")

Each job goes the way `python -m titanlite.train` goes (preflight, Trainer, the seed checkpoint
or train(), close) on a group the ranks made before the first job (helpers.spawn), which the
trainer therefore leaves alone. Rank 0 saves each job's result: every step's loss and gradient
norm, the step it resumed from, the tokens it has seen and, with `record`, the full gradients
of step 1 (after clipping, as the optimizer saw them) and the full final weights, gathered from
shards and pipeline stages, with the names of those whose copies on different ranks differ, and
what the layout did (`layout_facts`: the compiled modules, each cp rank's positions; for an
MoE, each router's chosen experts in step 1 with the windows they were for).
A job that fails ends the group: the jobs after it have no result, and result() says why.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from helpers import group_timeouts, spawn
from host_syncs import probed_train
from torch.distributed.tensor import DTensor

from models.moe import moe_layers
from titanlite.core import distributed
from titanlite.core.logging import init_logger
from titanlite.preflight import checks as preflight
from titanlite.trainer.trainer import Trainer


class TrainerJobs:
    """Training jobs of one world size: add() each, run() once, then result(name)."""

    def __init__(self, nproc: int, folder: Path) -> None:
        self.nproc, self.folder = nproc, folder
        self.jobs: dict[str, dict] = {}
        self.failure: str | None = None

    def add(self, name: str, argv: list[str], record: bool = False, probe: bool = False) -> Path:
        """A job with its dump folder folder/name (returned); `probe`: its result has the
        host syncs of each step (host_syncs.py) and the steps that logged."""
        dump = self.folder / name
        out = str(self.folder / f"{name}.result.pt")
        argv = [*argv, "--job.dump_folder", str(dump)]
        self.jobs[name] = {"argv": argv, "out": out, "record": record, "probe": probe}
        return dump

    def run(self) -> TrainerJobs:
        spec = self.folder / "jobs.json"
        spec.write_text(json.dumps(list(self.jobs.values())))
        try:
            spawn(run_jobs, self.nproc, str(spec))
        except Exception as error:  # told by result() to the tests whose jobs did not run
            log = self.folder / "rank0.log"
            tail = log.read_text()[-6000:] if log.exists() else ""
            self.failure = f"{error}\nrank 0's log ends:\n{tail}"
        return self

    def result(self, name: str) -> dict:
        out = Path(self.jobs[name]["out"])
        assert out.exists(), f"{name}: no result; the group of {self.nproc} failed: {self.failure}"
        return torch.load(out, weights_only=True)


def _clean(name: str) -> str:
    return name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")


def full_tensors(model: torch.nn.Module, what: str) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Every parameter's (what="param") or gradient's (what="grad") full value, merged over
    pipeline stages, and the names whose copies differ between the ranks that hold one (a
    replicated parameter, under DDP or a TP-replicated norm, is each rank's own copy; a sharded
    one is gathered). Collective: every rank calls it in step."""
    mine = {}
    values = [(name, p if what == "param" else p.grad) for name, p in model.named_parameters()]
    if what == "param":  # and the state a checkpoint keeps beside them (an MoE's expert bias)
        values += persistent_buffers(model)
    for name, value in values:
        if value is None:
            continue
        full = value.full_tensor() if isinstance(value, DTensor) else value
        mine[_clean(name)] = full.detach().cpu().float().clone()
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    merged: dict[str, torch.Tensor] = {}
    differ: set[str] = set()
    for part in everyone:
        for name, value in part.items():
            if name in merged and not torch.equal(merged[name], value):
                differ.add(name)
            merged.setdefault(name, value)
    return merged, sorted(differ)


def persistent_buffers(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [
        (f"{prefix}.{name}" if prefix else name, buffer)
        for prefix, module in model.named_modules()
        for name, buffer in module._buffers.items()
        if buffer is not None and name not in module._non_persistent_buffers_set
    ]


def layout_facts(model: torch.nn.Module, shards) -> dict:
    """What the layout did on every rank, for tests to compare with what was configured: the
    names of the compiled modules (merged over ranks and stages), under context parallel the
    window positions each rank held in its last step (`shards`: the SequenceShards), the
    parameters split over an expert-parallel mesh dim (name -> its degree), and the timeout of
    every process group of every rank.
    Collective."""
    compiled = [
        _clean(name)
        for name, module in model.named_modules()
        if getattr(module, "_compiled_call_impl", None) is not None
    ]
    expert_split = {
        _clean(name): param.device_mesh.size(param.device_mesh.mesh_dim_names.index("ep"))
        for name, param in model.named_parameters()
        if isinstance(param, DTensor) and "ep" in (param.device_mesh.mesh_dim_names or ())
    }
    held = None
    if shards is not None:
        held = (shards.mesh.get_local_rank(), shards.positions.tolist())
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (compiled, held, group_timeouts(), expert_split))
    positions = {}
    for _, rank_held, _, _ in everyone:
        if rank_held is not None:
            positions[rank_held[0]] = rank_held[1]
    return {
        "compiled": sorted({n for names, _, _, _ in everyone for n in names}),
        "cp_positions": positions,
        # Every process group of every rank: (its ranks, its collective timeout in seconds).
        "group_timeouts": [g for _, _, groups, _ in everyone for g in groups],
        "expert_split": {k: v for *_, split in everyone for k, v in split.items()},
    }


class FirstStepRouting:
    """Each MoE router's chosen experts in the first step, in call order, with the step's input
    windows, so that a test can match a rank's rows (its share of the batch; under context
    parallel its chunks of each window, under tensor parallel its piece of those; under pipeline
    parallel its stages' layers, whose calls follow the micro-batches in order) with one
    process's. Nothing for a dense model."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.inputs: list[torch.Tensor] = []
        self.chosen: dict[str, list[torch.Tensor]] = {}
        self.recording = True
        self.handles = [
            layer.router.register_forward_hook(functools.partial(self._chosen, _clean(name)))
            for name, layer in moe_layers(model)
        ]

    def _chosen(self, name: str, module, args, output) -> None:
        # A block recomputed under activation checkpointing runs inside backward: its forward
        # has been recorded already. A pipeline stage's first forward learns shapes, on garbage
        # after the first stage (parallelisms/pipeline.py): not a training forward.
        if self.recording and module.training and torch._C._current_graph_task_id() == -1:
            if not _inside("_forward_metadata_inference"):
                self.chosen.setdefault(name, []).append(output[1].detach().cpu())

    def gathered(self, trainer: Trainer) -> list | None:
        """Every rank's {tp, cp (its ranks on those meshes), inputs, chosen}. Collective."""
        for handle in self.handles:
            handle.remove()
        # Collective whatever this rank holds: a pipeline stage of dense blocks has no router
        # while the next stage's has (DeepSeek-V3's dense first block).
        has_router = torch.tensor([len(self.handles)])
        dist.all_reduce(has_router)
        if not has_router.item():
            return None
        meshes = trainer.meshes
        mine = {
            "tp": meshes.tp.get_local_rank() if meshes.tp is not None else 0,
            "cp": meshes.cp.get_local_rank() if meshes.cp is not None else 0,
            "inputs": torch.cat(self.inputs),
            "chosen": {name: torch.cat(calls) for name, calls in self.chosen.items()},
        }
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        return everyone


def _inside(function: str) -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False


class FirstStepGradients:
    """The trainer's own step, unchanged, that keeps the gradients its first call leaves."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer, self.step = trainer, trainer.train_step
        self.grads: dict[str, torch.Tensor] | None = None
        self.differ: list[str] = []
        self.routing: FirstStepRouting | None = None
        self.before: dict[str, torch.Tensor] = {}
        self.updates: dict[str, torch.Tensor] = {}

    def __call__(self, microbatches):
        if self.grads is None:
            self.before, _ = full_tensors(self.trainer.model, "param")
        if self.routing is not None and self.routing.recording:
            self.routing.inputs = [inputs.detach().cpu() for inputs, _ in microbatches]
        out = self.step(microbatches)
        if self.routing is not None:
            self.routing.recording = False
        if self.grads is None:
            self.grads, self.differ = full_tensors(self.trainer.model, "grad")
            after, _ = full_tensors(self.trainer.model, "param")
            self.updates = {k: after[k] - self.before[k] for k in self.before}
        return out


def run_job(argv: list[str], record: bool, on_trainer=None, probe: bool = False) -> dict:
    """One job on this rank; `on_trainer(trainer)`, if given, sees the trainer it built."""
    job, pre = preflight.run(argv, dist.get_world_size())
    # What start-up may take (a first compile), not the training timeout a previous job set.
    distributed.set_timeout(job.comm.init_timeout_seconds)
    trainer = Trainer(job, pre)
    if on_trainer is not None:
        on_trainer(trainer)
    syncs = probed_train(trainer) if probe else None
    try:
        result: dict = {"resumed_from": trainer.checkpointer.resumed_from, "tokens_seen": 0}
        if job.checkpoint.create_seed_checkpoint:
            trainer.save_seed_checkpoint()
            return result
        first = FirstStepGradients(trainer)
        if record:
            trainer.train_step = first  # type: ignore[assignment]
            # A hook inside a block compiled whole (fullgraph) cannot run: compiled layouts
            # are compared by their gradients and weights only.
            if not job.training.compile or trainer.meshes.ep is not None:
                first.routing = FirstStepRouting(trainer.model)
        records = trainer.train()
        result["tokens_seen"] = trainer.train_state.tokens_seen
        result["losses"] = [r["loss"] for r in records]
        result["grad_norms"] = [r["grad_norm"] for r in records]
        if syncs is not None:
            result["host_syncs"] = dict(syncs.events)
            result["logged_steps"] = [r["step"] for r in records]
        if record:
            result["grads"], result["grads_differ"] = first.grads, first.differ
            result["updates"] = first.updates
            result["weights"], result["weights_differ"] = full_tensors(trainer.model, "param")
            result.update(layout_facts(trainer.model, first.step.sequence_shards))
            result["routing"] = first.routing.gathered(trainer) if first.routing else None
        return result
    finally:
        trainer.close()
        torch._dynamo.reset()  # each job compiles its own model


def run_jobs(rank: int, world_size: int, spec: str) -> None:
    """One rank's part of every job in `spec`, its output in rank{rank}.log beside it."""
    log = os.open(Path(spec).with_name(f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    sys.stdout.flush(), sys.stderr.flush()
    os.dup2(log, 1), os.dup2(log, 2)
    init_logger()
    for job in json.loads(Path(spec).read_text()):
        result = run_job(job["argv"], job["record"], probe=job["probe"])
        if rank == 0:
            torch.save(result, job["out"])
        dist.barrier()
