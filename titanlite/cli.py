"""The trainer's entry point: preflight, build, train, and every way that can end turned into one
line on stderr and an exit code (2 user error, 3 non-finite training, 75 preempted, 130
interrupted; see docs/failures.md). `python -m titanlite.train` and `titanlite-train` run it."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import IO

from titanlite.components.nonfinite import NonFiniteTraining
from titanlite.components.preemption import (
    StopRequest,
    exit_code_for,
    requeue_slurm_job,
)
from titanlite.config import loader as config_lib
from titanlite.core import distributed, dump_lock
from titanlite.core.errors import INTERRUPTED, NONFINITE, USER_ERROR, error_line
from titanlite.core.logging import init_logger
from titanlite.preflight import checks as preflight
from titanlite.trainer.trainer import Trainer


def main(argv: list[str]) -> int:
    code, line = outcome(argv)
    if line:  # last, after anything training logged
        print(line, file=sys.stderr)
    return code


def outcome(argv: list[str]) -> tuple[int, str]:
    """Train; the exit code and, unless all went well, the one line that says why (for a
    launcher that reports it itself, such as titanlite/ray_launch.py)."""
    launch_start = time.perf_counter()
    init_logger()
    # First: a preemption notice during start-up must not kill the process (the default action
    # of SIGUSR1); it is honoured after the first step.
    stop = StopRequest()
    try:
        return _run(argv, stop, launch_start)
    except KeyboardInterrupt:  # Ctrl-C before the first step, or a second one during training
        return (
            INTERRUPTED,
            "titanlite: interrupted: stopped at once; training since the latest checkpoint is "
            "not saved",
        )


def _fail(error: BaseException, code: int) -> tuple[int, str]:
    return code, error_line(error)


def _run(argv: list[str], stop: StopRequest, launch_start: float) -> tuple[int, str]:
    try:
        job, pre = preflight.run(argv, distributed.launched_world_size())
    except preflight.user_errors() as e:
        return _fail(e, USER_ERROR)
    try:
        lock = _hold_dump_folder(job)  # noqa: F841 - held until the run ends
    except dump_lock.FolderInUse as e:
        return _fail(e, USER_ERROR)
    if job.job.print_config or job.job.print_args:
        if os.environ.get("RANK", "0") == "0":
            print(config_lib.to_toml(job))
    try:
        trainer = Trainer(job, pre, launch_start)
    except preflight.user_errors() as e:  # e.g. a checkpoint that cannot be resumed
        return _fail(e, USER_ERROR)
    interrupted = False
    failure: tuple[BaseException, int] | None = None
    try:
        if job.checkpoint.create_seed_checkpoint:
            trainer.save_seed_checkpoint()
        else:
            trainer.train(stop)
    except KeyboardInterrupt:
        interrupted = True  # at once: no waiting for background saves or for peers
        raise
    except NonFiniteTraining as e:
        failure = (e, NONFINITE)
    except preflight.user_errors() as e:  # e.g. a save that failed (disk full) under "stop"
        failure = (e, USER_ERROR)
    finally:
        if not interrupted:
            trainer.close()  # background saves of good steps complete first
    if failure is not None:  # said last, after anything close() logs
        return _fail(*failure)
    if trainer.preempted:
        # After close(): the checkpoint is complete on every rank before SLURM (which a
        # requeue makes end this allocation) sends its own SIGTERM/SIGKILL.
        if trainer.preempted != signal.SIGINT and job.job.requeue_on_preemption:
            if os.environ.get("RANK", "0") == "0":
                requeue_slurm_job(trainer.stop_message)
        return exit_code_for(trainer.preempted), f"titanlite: {trainer.stop_message}"
    return 0, ""


def _hold_dump_folder(job) -> IO[str] | None:
    """Rank 0 takes the dump folder's lock for the run unless the launcher that started it
    holds it (titanlite.launch on one node); see titanlite/core/dump_lock.py."""
    if os.environ.get("RANK", "0") != "0" or dump_lock.held_by_launcher(job.job.dump_folder):
        return None
    return dump_lock.hold(job.job.dump_folder)


def cli() -> None:
    sys.exit(main(sys.argv[1:]))
