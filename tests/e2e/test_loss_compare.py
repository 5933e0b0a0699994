"""scripts/loss_compare.py on real runs of the debug model: the same run twice is equal, another
learning rate is not (exit 1), user mistakes exit 2 with one line, a torn last line is read as
the trainer reads it, and --plot writes a real PNG."""

import json
import shutil
import struct
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers import ROOT, SHORT_RUN, check, clean_env, read_jsonl, run_script

STEPS = 4


def compare(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "scripts/loss_compare.py", *map(str, args)],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Dump folders of three short runs: `a` twice (deterministic), and `b` with twice the lr."""
    root = tmp_path_factory.mktemp("runs")
    lr = {"a": "8e-4", "a_again": "8e-4", "b": "1.6e-3"}

    def train(name):
        args = [*SHORT_RUN, "--training.steps", str(STEPS), "--optimizer.lr", lr[name]]
        args += ["--checkpoint.enable_checkpoint", "false", "--job.dump_folder", str(root / name)]
        return check(run_script("run_train.sh", args, timeout=300))

    with ThreadPoolExecutor(2) as pool:  # the CI machine has 2 cores
        list(pool.map(train, lr))
    return {name: root / name for name in lr}


@pytest.mark.slow
def test_equal_runs_pass_and_another_lr_fails_with_the_step(runs):
    same = compare(runs["a"], runs["a_again"], "--assert-equal", "--metrics", "loss", "grad_norm")
    assert same.returncode == 0, same.stdout + same.stderr
    assert (
        "loss: largest difference 0.000e+00 at step 1: equal within rtol 0, atol 0" in same.stdout
    )

    other = compare(runs["a"], runs["b"], "--assert-equal")
    assert other.returncode == 1, other.stdout + other.stderr
    # Step 1's loss is computed before the first update, so the runs part at step 2.
    assert "loss: largest difference" in other.stdout
    assert f"{STEPS - 1} step(s) beyond rtol 0, atol 0, first at step 2" in other.stdout
    rows = {int(r.split()[0]): r.split()[1:] for r in other.stdout.splitlines()[1 : STEPS + 1]}
    a, b = read_jsonl(runs["a"] / "metrics.jsonl"), read_jsonl(runs["b"] / "metrics.jsonl")
    assert sorted(rows) == list(range(1, STEPS + 1))
    for ra, rb in zip(a, b):
        assert [float(x) for x in rows[ra["step"]]] == pytest.approx(
            [ra["loss"], rb["loss"], rb["loss"] - ra["loss"]], rel=1e-5, abs=1e-3
        )
    assert compare(runs["a"], runs["b"], "--atol", "10").returncode == 0  # within a loose bound
    assert compare(runs["a"], runs["b"]).returncode == 0  # printing only


@pytest.mark.slow
def test_user_errors_exit_2_and_a_torn_line_is_skipped(runs, tmp_path):
    def error(*args) -> str:
        proc = compare(*args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        return lines[0]

    assert "no metrics.jsonl there" in error(runs["a"], tmp_path / "missing")
    later = tmp_path / "later"
    later.mkdir()
    (later / "metrics.jsonl").write_text(
        "".join(
            json.dumps({**r, "step": r["step"] + 100}) + "\n"
            for r in read_jsonl(runs["a"] / "metrics.jsonl")
        )
    )
    assert "no logged step in common (a: 1-4, later: 101-104)" in error(runs["a"], later)
    assert "no run logged 'perplexity'" in error(runs["a"], runs["b"], "--metrics", "perplexity")

    torn = tmp_path / "torn"
    shutil.copytree(runs["a_again"], torn)
    with (torn / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "loss": 3.1')  # a crash mid-write
    proc = compare(runs["a"], torn, "--assert-equal")
    assert proc.returncode == 0 and f"{STEPS} common steps" in proc.stdout, proc.stdout


@pytest.mark.slow
def test_plot_draws_every_run_into_a_real_png(runs, tmp_path):
    out = tmp_path / "curves.png"
    proc = compare(*runs.values(), "--metrics", "loss", "grad_norm", "tps", "--plot", out)
    assert proc.returncode == 0, proc.stderr  # tps differs, but only training figures are checked
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 600 and height > width  # three panels, one above the other
    import matplotlib.image

    assert matplotlib.image.imread(out).shape[:2] == (height, width)  # decodes as a PNG


@pytest.mark.slow
def test_a_torchtitan_log_sits_beside_titanlite_runs_with_a_summary(runs):
    tt_log = ROOT / "tests" / "fixtures" / "torchtitan_logs" / "debugmodel_cpu_seed42.log"
    proc = compare(
        f"torchtitan={tt_log}",
        f"mine={runs['a']}",
        f"double_lr={runs['b']}",
        *("--metrics", "loss", "grad_norm", "--summary-steps", "2", str(STEPS)),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout.splitlines()
    assert out[0].split()[1:4] == ["loss[torchtitan]", "loss[mine]", "loss[double_lr]"]
    mine = read_jsonl(runs["a"] / "metrics.jsonl")
    row4 = out[STEPS].split()
    # TorchTitan's step 4 (its log prints 5 decimals), this run's, and their difference.
    assert [float(x) for x in row4[:3]] == pytest.approx([STEPS, 5.79904, mine[3]["loss"]])
    assert float(row4[7]) == pytest.approx(mine[3]["loss"] - 5.79904, rel=1e-3)  # 4 digits
    assert f"{STEPS} common steps (1-{STEPS}); torchtitan lacks" not in proc.stdout
    summary = proc.stdout[proc.stdout.index("median tps") :]
    assert "torchtitan (1 runs)" in summary and "titanlite (2 runs)" in summary
    assert f"loss@{STEPS}: the torchtitan and titanlite ranges" in summary
