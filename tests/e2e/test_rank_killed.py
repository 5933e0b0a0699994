"""kill -9 of one rank that is not rank 0, through ./run_train.sh (issue 46, item 3): the last
line names that rank and its signal, the exit code is 137 (128 + 9), and the tracebacks of the
ranks that then fail because their peer vanished ("Connection closed by peer") are kept in
torchrun.log, not shown. One run per world size, killed once it has logged a step."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import NO_EVAL, ROOT, clean_env, expect_one_line

# The smallest model that trains, for far more steps than the test waits: alive when killed.
ENDLESS = [
    "--model.n_layers",
    "1",
    "--training.steps",
    "100000",
    "--training.seq_len",
    "64",
    "--training.local_batch_size",
    "2",
    "--metrics.enable_tensorboard",
    "false",
    *NO_EVAL,
]
STEP_LINE = re.compile(r"INFO step +\d")


def rank_pids(launcher: int) -> dict[int, int]:
    """{RANK: pid} of the launcher's children (run_train.sh execs it: torchrun's own pid)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) != launcher:
                continue
            environ = (stat.parent / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        env = dict(e.split(b"=", 1) for e in environ if b"=" in e)
        if b"RANK" in env:
            found[int(env[b"RANK"])] = int(stat.parent.name)
    return found


def kill_rank_once_training(folder: Path, nproc: int, victim: int) -> subprocess.CompletedProcess:
    """A run whose rank `victim` got SIGKILL once it had logged a step."""
    cmd = ["bash", str(ROOT / "run_train.sh"), *ENDLESS, "--job.dump_folder", str(folder)]
    out, err = folder / "stdout", folder / "stderr"
    # Files, not pipes: a rank that outlived the launcher would hold a pipe open.
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=clean_env(NGPU=str(nproc)),
            stdout=o,
            stderr=e,
            start_new_session=True,
        )
    try:
        deadline = time.time() + 120
        while not STEP_LINE.search(err.read_text()):
            assert proc.poll() is None, err.read_text()[-3000:]
            assert time.time() < deadline, "no step in time"
            time.sleep(0.1)
        os.kill(rank_pids(proc.pid)[victim], signal.SIGKILL)
        proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, out.read_text(), err.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("nproc,victim", [(2, 1), (4, 2)])
def test_kill_9_of_a_rank_names_it_with_exit_137_and_hides_the_peers_tracebacks(
    tmp_path, nproc, victim
):
    proc = kill_rank_once_training(tmp_path, nproc, victim)
    log = tmp_path / "torchrun.log"
    expect_one_line(
        proc, 137, f"titanlite: error: rank {victim} was killed by SIGKILL (signal 9)", str(log)
    )
    for stream in (proc.stdout, proc.stderr):  # no rank's traceback, collateral or not
        assert "Traceback" not in stream and "by peer" not in stream, stream[-3000:]
    report = log.read_text()
    assert "exitcode  : -9" in report and "Traceback (most recent call last)" in report
    assert "Connection closed by peer" in report or "Connection reset by peer" in report
