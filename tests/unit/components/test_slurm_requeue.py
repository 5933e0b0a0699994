"""requeue_slurm_job against a stand-in `scontrol` that does what a successful requeue does to the
allocation: it kills the process that asked. The line saying the job is requeued must already
be out (tests/slurm runs the real SLURM, where this raced)."""

import os
import subprocess
import sys

from titanlite.components.preemption import requeue_slurm_job

KILLING_SCONTROL = """#!/bin/sh
echo "$@" > "$(dirname "$0")/args"
kill -9 $PPID
"""


def _run_requeue(tmp_path, **env: str) -> subprocess.CompletedProcess:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scontrol").write_text(KILLING_SCONTROL)
    (fake / "scontrol").chmod(0o755)
    code = (
        "from titanlite.core.logging import init_logger; init_logger(); "
        "from titanlite.components.preemption import requeue_slurm_job; "
        "requeue_slurm_job('SIGUSR1: stopped after step 3')"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        # Without the SLURM variables of a suite that itself runs inside an allocation.
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")},
            "PATH": f"{fake}:{os.environ['PATH']}",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_requeue_line_is_out_before_scontrol_ends_the_allocation(tmp_path):
    proc = _run_requeue(tmp_path, SLURM_JOB_ID="42")
    assert proc.returncode == -9  # scontrol "ended the allocation"
    assert (tmp_path / "bin" / "args").read_text().split() == ["requeue", "42"]
    assert "requeueing SLURM job 42; it resumes from the checkpoint" in proc.stderr, proc.stderr
    # The run's own last line too: the launcher that would print it dies with the allocation.
    assert "SIGUSR1: stopped after step 3; requeueing SLURM job 42" in proc.stderr, proc.stderr


def test_an_array_task_is_requeued_by_its_own_id(tmp_path):
    proc = _run_requeue(tmp_path, SLURM_ARRAY_JOB_ID="7", SLURM_ARRAY_TASK_ID="3")
    assert (tmp_path / "bin" / "args").read_text().split() == ["requeue", "7_3"]
    assert "requeueing SLURM job 7_3" in proc.stderr


def test_outside_slurm_nothing_is_requeued(monkeypatch):
    for var in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(var, raising=False)
    assert requeue_slurm_job() is False
