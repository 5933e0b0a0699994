"""Bad input, round two (continued; issue 33) through the real entry points: a dump folder two
runs share, ranks orphaned by a kill -9 of the launcher, manifests without sizes, non-regular
files, absurd integers, the converters and the launcher's variables. One run killed with -9
(fixture `killed_run`) serves the lock, orphan and manifest cases; what preflight alone decides
runs in this process (helpers.preflight_cases), a few of them through ./run_train.sh."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import (
    ONE_STEP,
    ROOT,
    check,
    clean_env,
    dry_run,
    expect_one_line,
    in_pairs,
    preflight_cases,
    run_python,
)

from titanlite.components.checkpoint.folder import complete_steps
from titanlite.core import dump_lock

# A 2-rank run long enough to be killed while it trains, saving every 2 steps, keeping all.
LONG_RUN = [
    *ONE_STEP,
    "--training.steps",
    "100000",
    "--checkpoint.enable_checkpoint",
    "--checkpoint.interval",
    "2",
    "--checkpoint.keep_latest_k",
    "0",
]


def children(pid: int) -> list[int]:
    """The live (non-zombie) processes whose parent is `pid`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def snapshot(folder: Path) -> tuple:
    """What a rank still running would change: the checkpoints and the metrics."""
    names = sorted(p.name for p in (folder / "checkpoint").iterdir())
    return names, (folder / "metrics.jsonl").stat().st_size


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory) -> dict:
    """A 2-rank ./run_train.sh in its own process group; while it trains, a second run in the
    same folder is refused; then the group gets kill -9. What each step saw."""
    folder = tmp_path_factory.mktemp("killed_run")
    cmd = ["bash", str(ROOT / "run_train.sh"), *LONG_RUN, "--job.dump_folder", str(folder)]
    env = clean_env(NGPU="2")
    # Output to a file: an orphaned rank would hold a pipe open, and reading it would hang.
    log = (folder / "launch.log").open("w")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True, stdout=log, stderr=log)
    try:
        deadline = time.time() + 180
        while not any(s >= 2 for s in complete_steps(folder / "checkpoint")):
            assert proc.poll() is None, (folder / "launch.log").read_text()[-3000:]
            assert time.time() < deadline, "no checkpoint in time"
            time.sleep(0.05)
        second = in_pairs({"second": (["--job.dump_folder", str(folder)], {})})["second"]
        ranks = children(proc.pid)  # run_train.sh execs the launcher: proc.pid is torchrun's
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()
    deadline = time.time() + 10
    while any(map(alive, ranks)) and time.time() < deadline:
        time.sleep(0.1)
    survivors = [r for r in ranks if alive(r)]
    for r in survivors:  # the bug's leftovers must not outlive the test
        os.kill(r, signal.SIGKILL)
    at_kill = snapshot(folder)
    time.sleep(3)  # an orphan saves every 2 steps (~0.2 s): it would show in 3 s
    return dict(
        folder=folder,
        pid=proc.pid,
        second=second,
        ranks=ranks,
        survivors=survivors,
        at_kill=at_kill,
        later=snapshot(folder),
    )


@pytest.mark.slow
def test_a_second_run_in_a_busy_folder_is_refused_and_ranks_die_with_the_launcher(killed_run):
    folder, pid = killed_run["folder"], killed_run["pid"]
    expect_one_line(
        killed_run["second"], 2, f"job.dump_folder: {folder} is in use by another run (pid {pid}"
    )
    assert "Traceback" not in killed_run["second"].stderr
    assert len(killed_run["ranks"]) == 2, killed_run["ranks"]
    assert killed_run["survivors"] == [], "ranks outlived kill -9 of their launcher"
    assert killed_run["later"] == killed_run["at_kill"], "written after the kill"
    # Its output went to a file: plain text, no colour codes.
    log = (folder / "launch.log").read_text()
    assert "step      1" in log and "\033[" not in log, log[-2000:]


@pytest.mark.slow
def test_relaunch_after_kill_resumes_and_bad_manifests_are_one_line(killed_run, tmp_path):
    """The killed run's lock is stale (its holder is dead): a relaunch in that folder, as a
    SLURM requeue does, resumes. A manifest whose records lack size or crc32 is one line,
    exit 2, naming the file, from `checkpoint verify` and from a resume."""
    folder = killed_run["folder"]
    last = max(complete_steps(folder / "checkpoint"))
    damaged = tmp_path / "damaged"
    shutil.copytree(folder / "checkpoint" / f"step-{last}", damaged / "checkpoint" / "step-2")
    manifest = damaged / "checkpoint" / "step-2" / "manifest.json"
    record = json.loads(manifest.read_text())
    name = sorted(record["files"])[0]
    del record["files"][name]["size"]
    manifest.write_text(json.dumps(record))
    used = tmp_path / "used"  # a fresh start where an earlier run left its metrics
    used.mkdir()
    shutil.copy(folder / "metrics.jsonl", used / "metrics.jsonl")
    resume = ["--checkpoint.enable_checkpoint", "--training.steps"]
    got = in_pairs(
        {
            "relaunch": (["--job.dump_folder", str(folder), *resume, str(last + 1)], {}),
            "no_size": (["--job.dump_folder", str(damaged), *resume, "3"], {}),
            "rerun": (["--job.dump_folder", str(used)], {}),
        }
    )
    check(got["relaunch"])
    assert f"resuming at step {last}" in got["relaunch"].stderr + got["relaunch"].stdout
    assert "already holds" not in got["relaunch"].stderr  # a resume appends on purpose
    rerun = check(got["rerun"]).stderr
    assert f"{used / 'metrics.jsonl'} already holds an earlier run's steps" in rerun, rerun
    assert f"training done: 1 steps, 128 tokens; outputs in {used}" in rerun, rerun
    words = f"{manifest}: the record of {name} has no valid 'size'"
    expect_one_line(got["no_size"], 2, "titanlite: error: cannot load", words)
    verify = run_python(["-m", "titanlite.checkpoint", "verify", str(manifest.parent)])
    expect_one_line(verify, 2, "titanlite: error:", words)
    record["files"][name]["size"] = 1
    del record["files"][name]["crc32"]
    manifest.write_text(json.dumps(record))
    verify = run_python(["-m", "titanlite.checkpoint", "verify", str(manifest.parent)])
    expect_one_line(verify, 2, f"the record of {name} has no valid 'crc32'")
    for proc in (*got.values(), verify):
        assert "Traceback" not in proc.stderr, proc.stderr[-2000:]


@pytest.mark.slow
def test_preflight_refuses_busy_folders_special_files_huge_integers_and_launcher_vars(
    tmp_path, monkeypatch
):
    busy = tmp_path / "busy"
    lock = dump_lock.hold(busy)  # as a live run holds it: this very process
    monkeypatch.delenv(dump_lock.HELD_ENV)  # the cases are other runs, not this one's ranks
    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)
    data_fifo = tmp_path / "data.fifo"
    os.mkfifo(data_fifo)
    dump = ["--job.dump_folder", str(tmp_path / "out")]
    huge = str(10**30)
    cases = {
        "busy": (["--job.dump_folder", str(busy)], {}),
        "config_fifo": (["--config", str(fifo), *dump], {}),
        "dataset_fifo": ([*dump, "--training.dataset_path", str(data_fifo)], {}),
        "tokenizer_device": ([*dump, "--model.tokenizer_path", "/dev/null"], {}),
        "steps": ([*dump, "--training.steps", huge], {}),
        "seed_negative": ([*dump, "--training.seed", f"-{huge}"], {}),
        "ngpu_huge": (dump, {"NGPU": huge}),
        # issue 46, item 4: a traceback and exit 1 on the main of that day
        "dry_world_huge": (["--dry-run", "--dry-run.world_size", huge], {}),
        "log_rank_abc": (dump, {"LOG_RANK": "abc"}),
        "log_rank_5": (dump, {"LOG_RANK": "5", "NGPU": "2"}),
        "max_restarts": (dump, {"MAX_RESTARTS": "abc"}),
        "stop_grace": (dump, {"STOP_GRACE_SECONDS": "abc"}),
        "wandb_mode": ([*dump, "--metrics.enable_wandb"], {"WANDB_MODE": "bogus"}),
        "exclude_typo": ([*dump, "--checkpoint.exclude_from_loading", "model,optimiser"], {}),
    }
    try:
        shell = ("config_fifo", "dataset_fifo", "steps", "log_rank_5", "max_restarts")
        shell += ("dry_world_huge",)
        got = preflight_cases(cases, shell=(*shell, "wandb_mode"))
    finally:
        lock.close()
    expect_one_line(
        got["busy"], 2, f"job.dump_folder: {busy} is in use by another run (pid {os.getpid()}"
    )
    expect_one_line(got["config_fifo"], 2, f"--config {fifo}: {fifo} is a named pipe (FIFO); pass")
    expect_one_line(got["dataset_fifo"], 2, f"training.dataset_path: {data_fifo} is a named pipe")
    expect_one_line(got["tokenizer_device"], 2, "tokenizer_path: /dev/null is a character device")
    expect_one_line(
        got["steps"], 2, f"[training] steps = {huge}: out of range; must be within [1, 1000000000]"
    )
    expect_one_line(got["ngpu_huge"], 2, f"NGPU={huge}: expected a positive number of processes")
    expect_one_line(got["dry_world_huge"], 2, f"--dry-run.world_size = {huge}: must be <= 16777216")
    expect_one_line(got["seed_negative"], 2, f"[training] seed = -{huge}: out of range")
    expect_one_line(got["log_rank_abc"], 2, "LOG_RANK=abc: expected local ranks within 0..0")
    expect_one_line(got["log_rank_5"], 2, "LOG_RANK=5: expected local ranks within 0..1 (NGPU = 2)")
    expect_one_line(got["max_restarts"], 2, "MAX_RESTARTS=abc: expected a whole number >= 0")
    expect_one_line(got["stop_grace"], 2, "STOP_GRACE_SECONDS=abc: expected a whole number")
    expect_one_line(got["wandb_mode"], 2, "WANDB_MODE=bogus: wandb takes online, offline, disabled")
    expect_one_line(
        got["exclude_typo"], 2, "'optimiser' is not one of", "(did you mean 'optimizer'?)"
    )
    world_0 = dry_run("--dry-run.world_size", "0")
    expect_one_line(world_0, 2, "--dry-run.world_size = 0: must be >= 1")
    nodes = dry_run(NNODES=huge)
    expect_one_line(nodes, 2, f"NNODES = {huge}: must be <= 16777216")
    memory = dry_run("--dry-run.device_memory_gib", "inf")
    expect_one_line(memory, 2, "--dry-run.device_memory_gib = 'inf': expected a finite number")
    for proc in (*got.values(), world_0, nodes, memory):
        assert "Traceback" not in proc.stderr, proc.stderr[-2000:]


class _Exploit:
    def __reduce__(self):
        return (os.system, ("true",))


def test_converters_refuse_unreadable_sources_and_missing_folders_in_one_line(tmp_path):
    import pickle

    import torch

    crafted, text = tmp_path / "crafted.pt", tmp_path / "notes.txt"
    torch.save({"w": _Exploit()}, crafted)
    pickled = tmp_path / "plain.pkl"
    pickled.write_bytes(pickle.dumps({"w": _Exploit()}))
    text.write_text("hello world\n")
    # The destination is checked before the source is read: this one is never opened.
    unread = tmp_path / "checkpoint-never-read"
    missing = tmp_path / "no" / "such" / "model.pt"
    cases = {
        "crafted": ("torch-to-dcp", crafted, tmp_path / "crafted"),
        "pickled": ("torch-to-dcp", pickled, tmp_path / "pickled"),
        "text": ("torch-to-dcp", text, tmp_path / "text"),
        "missing": ("dcp-to-torch", unread, missing),
    }
    with ThreadPoolExecutor(2) as pool:
        runs = {
            name: pool.submit(run_python, ["scripts/convert_checkpoint.py", *map(str, args)])
            for name, args in cases.items()
        }
        got = {name: f.result() for name, f in runs.items()}
    refused = "torch.load(weights_only=True) refuses it"
    expect_one_line(got["crafted"], 2, f"convert_checkpoint: error: {crafted}: {refused}", "posix")
    expect_one_line(got["pickled"], 2, f"{pickled}: {refused} (Unsupported operand")
    expect_one_line(got["text"], 2, f"{text} is not a torch.save file (it starts with b'hell')")
    expect_one_line(got["missing"], 2, f"folder {missing.parent} does not exist; create it first")
    for name, proc in got.items():
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert not (tmp_path / name).exists()


@pytest.mark.slow
def test_ray_use_gpu_without_gpus_is_one_line(tmp_path):
    pytest.importorskip("ray.train", reason="the ray extra (pip install -e '.[ray]')")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs: the local Ray instance would have them")
    dump = ["--job.dump_folder", str(tmp_path / "out")]
    proc = run_python(
        ["scripts/ray_train.py", "--num-workers", "1", "--use-gpu", *ONE_STEP, *dump], timeout=180
    )
    expect_one_line(proc, 2, "--use-gpu: the Ray cluster has 0 GPU(s) and --num-workers 1 needs 1")
    assert "Traceback" not in proc.stderr
