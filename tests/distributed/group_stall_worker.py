"""A real stall in every kind of process group the trainer's meshes build. For each layout, the
trainer trains one step (its loop then sets comm.train_timeout_seconds on its groups); then, one
group at a time, the group's last rank stays away while its peers run an all-reduce in it, and
each peer records how long it waited and how the wait ended. Rank 0 writes the records as JSON.

    spawn(run, 4, {layout: argv}, out)
"""

from __future__ import annotations

import json
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from trainer_jobs import run_job

from titanlite.trainer.trainer import Trainer

# The group the ranks meet in between stalls: its own timeout, reset after each layout.
SYNC_TIMEOUT = timedelta(seconds=120)


def _stall_each_group(rank: int, groups: list[dist.ProcessGroup], sync) -> list[dict]:
    records = []
    for group in groups:
        ranks = dist.get_process_group_ranks(group)
        if rank in ranks and rank != max(ranks):  # the last rank stays away
            start = time.monotonic()
            try:
                dist.all_reduce(torch.ones(1), group=group)
                ended = "completed"
            except RuntimeError as error:
                ended = str(error).splitlines()[0]
            records.append(
                {
                    "group": group.group_desc,
                    "ranks": ranks,
                    "rank": rank,
                    "waited_s": round(time.monotonic() - start, 2),
                    "ended": ended,
                }
            )
        dist.barrier(group=sync)
    return records


def run(rank: int, world_size: int, layouts: dict[str, list[str]], out: str) -> None:
    sync = dist.new_group(backend="gloo")
    kept: dict[str, Trainer] = {}

    def keep(trainer: Trainer) -> None:  # the trainer of the job that run_job is running
        kept["trainer"] = trainer

    records: dict[str, list] = {}
    for name, argv in layouts.items():
        run_job(argv, record=False, on_trainer=keep)
        dist.distributed_c10d._set_pg_timeout(SYNC_TIMEOUT, sync)
        meshes = kept.pop("trainer").meshes
        default = dist.distributed_c10d._get_default_group()
        groups = [g for g in meshes.groups() if g is not default]
        mine = _stall_each_group(rank, groups, sync)
        everyone: list = [None] * world_size
        dist.all_gather_object(everyone, mine, group=sync)
        records[name] = [r for part in everyone for r in part]
    if rank == 0:
        with open(out, "w") as f:
            json.dump(records, f)
