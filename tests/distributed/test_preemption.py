"""Preemption and restart on real processes: SIGUSR1 stops every rank at the same step with a
complete checkpoint and exit status 75, and a relaunch ends where an uninterrupted run ends;
SIGKILL of one rank makes torchrun (MAX_RESTARTS) restart the group from the latest checkpoint."""

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import (
    ROOT,
    SHORT_RUN,
    SHORT_RUN_STEPS,
    check,
    clean_env,
    free_port,
    losses_by_step,
    resumed_step_and_same_losses,
    wait_for_step,
)

from titanlite.components.checkpoint.folder import complete_steps
from titanlite.components.checkpoint.storage import verify
from titanlite.core.errors import PREEMPTED

STEPS, ARGS, losses = SHORT_RUN_STEPS, SHORT_RUN, losses_by_step


def torchrun_cmd(folder, *extra: str, max_restarts: int = 0) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--nnodes=1",
        f"--master_port={free_port()}",
        f"--max-restarts={max_restarts}",
        "-m",
        "titanlite.train",
        *ARGS,
        "--job.dump_folder",
        str(folder),
        *extra,
    ]


def workers(folder) -> dict[int, int]:
    """{local rank: pid} of the titanlite.train processes writing to `folder`."""
    out = subprocess.run(
        ["pgrep", "-f", f"titanlite.train.*{folder}"], capture_output=True, text=True
    ).stdout.split()
    found = {}
    for pid in map(int, out):
        try:
            environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        env = dict(e.split(b"=", 1) for e in environ if b"=" in e)
        if b"LOCAL_RANK" in env:
            found[int(env[b"LOCAL_RANK"])] = pid
    return found


@pytest.mark.slow
def test_sigusr1_to_one_rank_stops_all_with_a_checkpoint_and_resume_matches(
    two_rank_reference, tmp_path
):
    # Async saves every 2 steps, and the signal is sent while one is in flight: the stop must
    # finish it (partial dir + rename) and leave only loadable checkpoints.
    proc = subprocess.Popen(
        torchrun_cmd(tmp_path, "--checkpoint.interval", "2", "--checkpoint.async_mode", "async"),
        cwd=ROOT,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_step(tmp_path, 2, proc)
        deadline = time.time() + 60
        while not list((tmp_path / "checkpoint").glob(".step-*.partial")):
            assert time.time() < deadline and proc.poll() is None, "never caught a save in flight"
            time.sleep(0.002)
        os.kill(workers(tmp_path)[1], signal.SIGUSR1)  # rank 1 only: rank 0 must follow
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert f"exitcode  : {PREEMPTED}" in err, err[-3000:]  # torchrun's failure report
    # Each rank's final line (plain torchrun: no titanlite.launch to say it once): both ranks,
    # the same step.
    stopped = [ln for ln in err.splitlines() if ln.startswith("titanlite: SIGUSR1: stopped after")]
    assert len(stopped) == 2, err[-3000:]
    step = int(stopped[0].split("after step ")[1].split(";")[0])
    assert all(f"after step {step};" in ln for ln in stopped)
    assert 2 <= step < STEPS
    steps = complete_steps(tmp_path / "checkpoint")
    assert steps[-1] == step and not list((tmp_path / "checkpoint").glob(".step-*.partial"))
    for s in steps:
        assert verify(tmp_path / "checkpoint" / f"step-{s}") == []
    assert max(losses(tmp_path)) == step

    resumed = check(
        subprocess.run(
            torchrun_cmd(
                tmp_path, "--checkpoint.interval", "2", "--checkpoint.async_mode", "async"
            ),
            cwd=ROOT,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
    )
    assert f"resuming at step {step}" in resumed.stderr
    got = losses(tmp_path)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert all(got[s] == two_rank_reference[s] for s in got), (got, two_rank_reference)  # bit-exact


@pytest.mark.slow
def test_sigkill_of_one_rank_restarts_the_group_from_the_latest_checkpoint(
    two_rank_reference, tmp_path
):
    # Through run_train.sh: MAX_RESTARTS reaches torchrun.
    cmd = [
        "bash",
        str(ROOT / "run_train.sh"),
        *ARGS,
        "--checkpoint.interval",
        "4",
        "--job.dump_folder",
        str(tmp_path),
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=clean_env(NGPU="2", MAX_RESTARTS="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_step(tmp_path, 4, proc)
        killed_at = time.time()
        os.kill(workers(tmp_path)[1], signal.SIGKILL)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            # The workers hold the pipes: without them gone, communicate() would wait for them.
            for pid in [*workers(tmp_path).values(), proc.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            out, err = proc.communicate(timeout=30)
            print(err[-6000:])
    assert proc.returncode == 0, err[-4000:]
    step = resumed_step_and_same_losses(out + err, tmp_path, two_rank_reference)
    assert step >= 4 and step % 4 == 0
    print(
        f"SIGKILL after step-{step} was saved; restarted group done "
        f"{time.time() - killed_at:.1f}s after the kill"
    )
