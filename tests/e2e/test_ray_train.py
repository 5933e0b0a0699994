"""scripts/ray_train.py on a real local Ray instance: Ray Train's TorchTrainer with 2 CPU workers
trains the debug model bit for bit like 2 torchrun ranks, and when a worker process is killed
Ray's FailureConfig restarts the group, which resumes from the latest titanlite checkpoint.
Mistakes stop in the driver's preflight before Ray starts. One Ray launch in all: each costs
tens of seconds of Ray start-up here."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import (
    DEBUG_CONFIG,
    ROOT,
    SHORT_RUN,
    SHORT_RUN_STEPS,
    clean_env,
    resumed_step_and_same_losses,
    run_python,
    wait_for_step,
)

from titanlite.components.checkpoint.folder import complete_steps

pytest.importorskip("ray.train", reason="the ray extra (pip install -e '.[ray]')")

SCRIPT = str(ROOT / "scripts" / "ray_train.py")


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def ray_train_workers(driver: int) -> list[int]:
    """The Ray Train worker processes of this driver's local Ray instance (its descendants:
    other Ray instances on the machine are left alone)."""
    pids = []
    for pid in descendants(driver):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::RayTrainWorker"):
                pids.append(pid)
    return pids


@pytest.mark.slow
def test_two_ray_workers_match_torchrun_and_resume_after_one_is_killed(
    two_rank_reference, tmp_path
):
    args = ["--num-workers", "2", "--max-failures", "1", *SHORT_RUN, "--checkpoint.interval", "2"]
    proc = subprocess.Popen(
        [sys.executable, SCRIPT, *args, "--job.dump_folder", str(tmp_path)],
        cwd=ROOT,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the local Ray instance's processes go with the driver
    )
    try:
        wait_for_step(tmp_path, 1, proc, timeout=300)
        workers = ray_train_workers(proc.pid)
        assert len(workers) == 2, workers
        saved = complete_steps(tmp_path / "checkpoint")[-1]
        os.kill(workers[0], signal.SIGKILL)  # as the OOM killer or a lost node would
        killed_at = time.time()
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate(timeout=30)
            print(err[-6000:])
    assert proc.returncode == 0, err[-4000:]
    assert saved < SHORT_RUN_STEPS, "the run was over before the kill"
    log = out + err
    assert "[FailurePolicy] RETRY" in log, log[-4000:]  # Ray's decision, in its own words
    # The steps after the checkpoint were trained twice, the same both times.
    assert resumed_step_and_same_losses(log, tmp_path, two_rank_reference) >= saved
    print(
        f"worker killed after step-{saved} was saved; restarted group done "
        f"{time.time() - killed_at:.1f}s after the kill"
    )


def test_mistakes_stop_in_the_driver_with_one_line_before_ray_starts(tmp_path):
    for extra, words in [
        (["--parallelism.tensor_parallel_degree", "3"], "tensor_parallel_degree"),
        (["--num-workers", "0"], "argument --num-workers: 0: must be >= 1"),
    ]:
        proc = run_python(
            [
                SCRIPT,
                "--num-workers",
                "2",
                "--config",
                str(DEBUG_CONFIG),
                "--job.dump_folder",
                str(tmp_path),
                *extra,
            ],
            timeout=120,
        )
        assert proc.returncode == 2, proc.stderr[-3000:]
        lines = (proc.stdout + proc.stderr).strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("titanlite: error:"), lines
        assert words in lines[0], lines
    assert not (tmp_path / "ray").exists()


def test_a_worker_returns_its_exit_code_and_line_from_a_thread_on_a_given_group(tmp_path):
    """What a Ray Train worker does, without Ray: the process group exists already (Ray made
    it) and the trainer runs in a thread of its own (no signal handlers can be installed
    there). A run that diverges ends with exit code 3 and its one line, which the driver
    then passes on."""
    code = f"""
import os, sys, threading
import torch.distributed as dist
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
from titanlite.ray_launch import worker
out = []
argv = ["--config", {str(DEBUG_CONFIG)!r}, "--optimizer.lr", "1e6", "--training.steps", "4",
        "--training.seq_len", "64", "--training.local_batch_size", "2",
        "--metrics.enable_tensorboard", "false", "--job.dump_folder", {str(tmp_path)!r}]
t = threading.Thread(target=lambda: out.append(worker(
    {{"argv": argv, "cwd": "/nonexistent", "log_ranks": ["0"]}})))
t.start(); t.join()
print("RESULT", out[0][0], out[0][1])
"""
    proc = run_python(["-c", code], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert result.startswith("RESULT 3 titanlite: error: step 3: the gradient norm is nan"), result
