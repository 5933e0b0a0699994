"""Graceful stop on preemption: SIGTERM or SIGUSR1 (SLURM's `--signal=USR1@120`) ends the run at
the end of the current step, after a synchronous checkpoint, and under SLURM requeues the job.
Ctrl-C (SIGINT) stops the same way, with exit status 130 and no requeue; a second Ctrl-C stops
at once, without a checkpoint.

The signal handler only sets a flag: a handler that saved or exited itself could fire inside a
collective or in the middle of a checkpoint write. The flag is turned into a decision that every
rank shares by an all-reduce (MAX) of a single int, because a signal reaches ranks at different
moments and a rank that stops alone would leave the others waiting in the next collective. The
all-reduce runs in the background (gloo, a host tensor): each step starts one and reads the one
the step before started, which has had a whole step to finish, so no step waits on a
world-wide collective and every rank decides at the same step, one step after the signal. Exit status `PREEMPTED` (75, EX_TEMPFAIL: "try again later") tells a
launcher that the run stopped on purpose with its progress saved.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

from titanlite.core.errors import INTERRUPTED, PREEMPTED
from titanlite.core.logging import logger

# Ctrl-C in a terminal signals the whole foreground process group, so a rank gets SIGINT from
# the terminal and, milliseconds later, the copy torchrun forwards: only a SIGINT this long after
# the first is a second Ctrl-C from the user.
SECOND_INTERRUPT_AFTER_S = 1.0


def exit_code_for(signum: int) -> int:
    return INTERRUPTED if signum == signal.SIGINT else PREEMPTED


class StopRequest:
    """Installs the handlers; `agreed()` is the collective decision, called once per step."""

    def __init__(self) -> None:
        self.signum = 0
        self._interrupted_at: float | None = None
        self._pending: tuple[dist.Work, torch.Tensor] | None = None  # the reduction under way
        self._previous: dict[int, Any] = {}
        # Python installs handlers only from the main thread. Ray Train runs the trainer in a
        # thread of its worker process; there no signal reaches it, and a stop is Ray's: it ends
        # the worker group, which restarts from the latest checkpoint (docs/ray.md).
        self._handles_signals = threading.current_thread() is threading.main_thread()
        if self._handles_signals:
            # SIGUSR1 at once: SLURM's notice may come during start-up (it would kill the
            # process); it is honoured after the first step.
            self._previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self._handle)

    def arm(self) -> None:
        """SIGTERM only from the first step on. A Python handler runs only between bytecodes,
        so while start-up blocks in C++ (a store or rendezvous wait for a rank that died) a
        handled SIGTERM would be ignored, and torchrun, which stops a failed group with
        SIGTERM, would have to wait for its SIGKILL. With nothing to save yet, the default
        action (die now) is right. Likewise SIGINT: before the first step Ctrl-C simply
        interrupts (main turns the KeyboardInterrupt into one line)."""
        for s in (signal.SIGTERM, signal.SIGINT) if self._handles_signals else ():
            self._previous[s] = signal.signal(s, self._handle)

    def _handle(self, signum: int, frame) -> None:
        # Nothing else here: logging or I/O from a handler can deadlock on the interrupted
        # thread's locks.
        if signum == signal.SIGINT:
            now = time.monotonic()
            if self._interrupted_at is None:
                self._interrupted_at = now
            elif now - self._interrupted_at > SECOND_INTERRUPT_AFTER_S:
                raise KeyboardInterrupt  # the user insists: stop now, without a checkpoint
        if not self.signum:
            self.signum = signum

    def agreed(self) -> int:
        """The signal number any rank had received by the previous call (0 = keep training;
        alone, the current one): the same on every rank. Called once per step by every rank."""
        if not (dist.is_initialized() and dist.get_world_size() > 1):
            return self.signum
        decided = self._collect()
        if not decided:
            flag = torch.tensor([self.signum], dtype=torch.int32, device="cpu")
            self._pending = (dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True), flag)
        return decided

    def _collect(self) -> int:
        """The result of the reduction under way (0 if none)."""
        if self._pending is None:
            return 0
        work, flag = self._pending
        self._pending = None
        work.wait()
        return int(flag.item())  # a host tensor: no device sync

    def restore(self) -> None:
        self._collect()  # every rank started it: let it finish before the group is reused
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def requeue_slurm_job(stopped: str = "") -> bool:
    """`scontrol requeue $SLURM_JOB_ID` (rank 0 only, after the checkpoint is complete): SLURM
    then ends this allocation and schedules the job again; it resumes from the checkpoint.
    `stopped`, the run's last line, leads the requeue line: titanlite.launch, which would print
    it after the ranks end, may be killed with the allocation first."""
    job_id = os.environ.get("SLURM_ARRAY_JOB_ID") or os.environ.get("SLURM_JOB_ID")
    if not job_id:
        return False
    if task := os.environ.get("SLURM_ARRAY_TASK_ID"):
        job_id = f"{job_id}_{task}"
    # Said before, not after: a successful requeue ends this allocation at once, and SLURM may
    # kill this process before a line written after `scontrol` returns reaches the log.
    said = f"{stopped}; " if stopped else ""
    logger.info(
        f"{said}requeueing SLURM job {job_id}; it resumes from the checkpoint when rescheduled"
    )
    proc = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True)
    if proc.returncode != 0:
        logger.warning(
            f"scontrol requeue {job_id} failed ({proc.returncode}): "
            f"{proc.stderr.strip() or proc.stdout.strip()}"
        )
        return False
    return True
