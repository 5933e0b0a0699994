"""Progress survives what users do to a run: Ctrl-C (once: graceful stop with a checkpoint, exit
130, its line shown once; twice: at once), SIGTERM to the launcher (the same, exit 75), a full
disk during a sync or async save (one line, the partial folder removed, the previous checkpoint
intact; stop or continue), a torn last line in metrics.jsonl, and a changed optimizer setting
on resume (a warning, or applied on request)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import DEBUG_CONFIG, NO_EVAL, ROOT, clean_env

from titanlite.components.checkpoint.folder import complete_steps
from titanlite.components.checkpoint.storage import verify
from titanlite.components.optim import lr_factor
from titanlite.config.loader import load

SMALL = [
    "--config",
    str(DEBUG_CONFIG),
    "--training.seq_len",
    "64",
    "--training.local_batch_size",
    "2",
    "--metrics.log_freq",
    "1",
    "--metrics.enable_tensorboard",
    "false",
    *NO_EVAL,
    "--checkpoint.enable_checkpoint",
]


def trainer(args: list[str], **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "titanlite.train", *args],
        cwd=ROOT,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,
    )


def run(args: list[str]) -> subprocess.CompletedProcess:
    proc = trainer(args)
    out, _ = proc.communicate(timeout=600)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def wait_for(proc: subprocess.Popen, text: str, lines: list[str], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if text in line:
            return
    proc.kill()
    raise AssertionError(f"never saw {text!r}:\n{''.join(lines)[-3000:]}")


def last_line(out: str) -> str:
    return out.strip().splitlines()[-1]


@pytest.mark.slow
@pytest.mark.parametrize(
    "how, code, said",
    [
        # Like a terminal: SIGINT to the whole process group (run_train.sh, torchrun, both
        # ranks), so each rank gets it twice within milliseconds (directly, and forwarded).
        ("ctrl_c", 130, "Ctrl-C"),
        # Like a scheduler: SIGTERM to the launcher alone (run_train.sh execs it), which
        # forwards it to the ranks.
        ("sigterm", 75, "SIGTERM"),
    ],
)
def test_a_stop_signal_through_run_train_sh_stops_gracefully_with_a_checkpoint(
    tmp_path, how, code, said
):
    proc = subprocess.Popen(
        ["bash", str(ROOT / "run_train.sh"), *SMALL, "--training.steps", "1000"]
        + ["--checkpoint.interval", "1000", "--job.dump_folder", str(tmp_path)],
        cwd=ROOT,
        env=clean_env(NGPU="2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    wait_for(proc, "step      2", lines)
    if how == "ctrl_c":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    out = "".join(lines) + out
    assert proc.returncode == code, out[-3000:]
    assert "KeyboardInterrupt" not in out and "Traceback" not in out
    assert last_line(out).startswith(f"titanlite: {said}: stopped after step ")
    # Once: not also logged by the rank, nor printed by it before the launcher's copy.
    assert out.count(f"{said}: stopped after step") == 1, out[-3000:]
    step = int(last_line(out).split("after step ")[1].split(";")[0])
    assert complete_steps(tmp_path / "checkpoint") == [step]
    assert verify(tmp_path / "checkpoint" / f"step-{step}") == []


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once(tmp_path):
    # Long steps (40 full debug windows: ~5 s each on 2 idle cores, ~1 s per 8 windows), so the
    # graceful stop is still under way when the user presses Ctrl-C again 1.5 s later. With the
    # preset's 8 windows a fast machine finished the step, and the graceful stop, first.
    proc = trainer(
        [
            "--config",
            str(DEBUG_CONFIG),
            "--training.steps",
            "100",
            "--training.local_batch_size",
            "40",
            "--metrics.enable_tensorboard",
            "false",
            *NO_EVAL,
            "--checkpoint.enable_checkpoint",
            "--job.dump_folder",
            str(tmp_path),
        ]
    )
    lines: list[str] = []
    wait_for(proc, "step      1", lines)
    # After step 1's stop agreement (microseconds after its log line), so the graceful stop
    # waits for the end of step 2, which takes seconds: the second Ctrl-C comes during it.
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    time.sleep(1.5)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=300)
    out = "".join(lines) + out
    assert proc.returncode == 130, out[-3000:]
    assert last_line(out).startswith("titanlite: interrupted: stopped at once"), out[-2000:]
    assert "Traceback" not in out
    assert complete_steps(tmp_path / "checkpoint") == []  # nothing half-written left as complete


@pytest.fixture
def small_disk(tmp_path):
    """A 100 MB tmpfs: room for one debug checkpoint (63 MB) but not two."""
    mount = tmp_path / "disk"
    mount.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=100m", "tmpfs", str(mount)],
            check=True,
            capture_output=True,
        )
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {e}")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


@pytest.mark.slow
@pytest.mark.parametrize("mode, policy", [("disabled", "continue"), ("async", "stop")])
def test_a_full_disk_keeps_the_previous_checkpoint(small_disk, mode, policy):
    dump = small_disk / "run"
    proc = run(
        [*SMALL, "--training.steps", "3", "--checkpoint.interval", "1"]
        + ["--checkpoint.async_mode", mode, "--checkpoint.on_save_error", policy]
        + ["--job.dump_folder", str(dump)]
    )
    folder = dump / "checkpoint"
    message = f"checkpoint {folder / 'step-2'} could not be written (no space left on device)"
    if policy == "stop":
        assert proc.returncode == 2, proc.stdout[-3000:]
        assert last_line(proc.stdout).startswith(f"titanlite: error: {message}")
    else:
        assert proc.returncode == 0, proc.stdout[-3000:]
        assert message in proc.stdout and "training continues" in proc.stdout
        assert "training done: 3 steps" in proc.stdout
    assert complete_steps(folder) == [1]
    assert verify(folder / "step-1") == []
    assert [p.name for p in folder.iterdir()] == ["step-1"]  # no partial folder left behind


@pytest.mark.slow
def test_torn_metrics_line_and_a_changed_optimizer_setting_on_resume(tmp_path):
    first = run([*SMALL, "--training.steps", "2", "--job.dump_folder", str(tmp_path)])
    assert first.returncode == 0, first.stdout[-3000:]
    metrics = tmp_path / "metrics.jsonl"
    with metrics.open("a") as f:
        f.write('{"step": 3, "loss": 5.1')  # a crash in the middle of a write

    # Resume with another peak LR: the checkpoint's continues, said once, and config.toml
    # records what runs.
    resumed = run(
        [*SMALL, "--training.steps", "3", "--optimizer.lr", "1e-3"]
        + ["--job.dump_folder", str(tmp_path)]
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "resuming at step 2" in resumed.stdout
    assert "optimizer.lr: the checkpoint's 0.003 continues, not the configured 0.001" in (
        resumed.stdout
    )
    assert load(["--config", str(tmp_path / "config.toml")]).optimizer.lr == 0.003

    # Asked for explicitly, the new value applies.
    applied = run(
        [*SMALL, "--training.steps", "4", "--optimizer.lr", "1e-3"]
        + ["--checkpoint.apply_new_optimizer_settings", "--job.dump_folder", str(tmp_path)]
    )
    assert applied.returncode == 0, applied.stdout[-3000:]
    assert "optimizer.lr = 0.001 applied over the checkpoint's 0.003" in applied.stdout

    lines = metrics.read_text().splitlines()
    assert lines[2] == '{"step": 3, "loss": 5.1'  # the user's file is kept as it was
    records = [json.loads(line) for i, line in enumerate(lines) if i != 2]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    sched = load([*SMALL[:2]]).lr_scheduler
    # The new peak LR, on the schedule of this launch (the schedule's shape is always the
    # config's).
    assert records[3]["lr"] == pytest.approx(1e-3 * lr_factor(3, 4, sched), rel=1e-9)
