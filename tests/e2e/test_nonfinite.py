"""Non-finite training stops instead of saving garbage: `--optimizer.lr 1e6` drives the debug
model's gradient norm to NaN at step 3 (measured: steps 1 and 2 stay finite). Every rank stops
at the same step with one line and exit code 3, no checkpoint is written from the bad step, what
was saved is finite (read back with DCP's own loader), and metrics.jsonl stays strict JSON."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import DEBUG_CONFIG, NO_EVAL, ROOT, clean_env, launch_worker, run_script

from titanlite.components.checkpoint.storage import load_full_state_dict

DIVERGING = [
    "--config",
    str(DEBUG_CONFIG),
    "--optimizer.lr",
    "1e6",
    "--training.steps",
    "8",
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
    "--checkpoint.interval",
    "1",
]


def strict_jsonl(path: Path) -> list[dict]:
    def refuse(token: str) -> None:
        raise AssertionError(f"{path}: {token} is not JSON")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


def all_finite(tree) -> bool:
    if isinstance(tree, dict):
        return all(all_finite(v) for v in tree.values())
    if isinstance(tree, torch.Tensor) and tree.is_floating_point():
        return bool(torch.isfinite(tree).all())
    return True


def saved_steps(folder: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in (folder / "checkpoint").glob("step-*"))


@pytest.mark.slow
def test_every_rank_stops_at_the_same_step_without_saving_it(tmp_path):
    proc = run_script(
        "run_train.sh",
        [*DIVERGING, "--job.dump_folder", str(tmp_path)],
        NGPU="2",
        LOG_RANK="0,1",
    )
    assert proc.returncode == 3, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("titanlite: error: step 3: the gradient norm is nan")
    # Once, though both ranks stop with it and both are shown (LOG_RANK=0,1): the launcher's.
    errors = [line for line in proc.stderr.splitlines() if "titanlite: error:" in line]
    assert errors == [last], errors
    assert saved_steps(tmp_path) == [1, 2]  # the bad step is never saved
    for step in (1, 2):
        assert all_finite(load_full_state_dict(tmp_path / "checkpoint" / f"step-{step}"))
    assert [r["step"] for r in strict_jsonl(tmp_path / "metrics.jsonl")] == [1, 2]


@pytest.mark.slow
@pytest.mark.parametrize(
    "layout",
    [
        [],  # FSDP 2: the bad rank's gradients reach the others through the reduce-scatter
        [  # DDP 2: through the all-reduce
            "--parallelism.data_parallel_replicate_degree",
            "2",
            "--parallelism.data_parallel_shard_degree",
            "1",
        ],
    ],
    ids=["fsdp2", "ddp2"],
)
def test_nan_on_one_rank_stops_every_rank_at_that_step_without_its_update(tmp_path, layout):
    """Only rank 1's output turns NaN (its third forward); rank 0 computes finite values. Every
    rank must still stop at step 3 with the same line, and none may apply the update."""
    args = [*DIVERGING, "--optimizer.lr", "1e-3", *layout, "--job.dump_folder", str(tmp_path)]
    proc = launch_worker(2, "fault_worker", args, FAULT="nan_output", FAULT_RANK="1", FAULT_AT="3")
    assert proc.returncode == 3, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "titanlite: error:" in line]
    # Once (the launcher's), though every rank stops with it.
    assert len(errors) == 1, errors
    assert errors[0].startswith("titanlite: error: step 3: the gradient norm is nan")
    # Each rank stopped on its own verdict, not because its peer went away.
    for rank in (0, 1):
        code, line = json.loads((tmp_path / f"rank{rank}_outcome.json").read_text())
        assert (code, line) == (3, errors[0]), (rank, code, line)
    assert saved_steps(tmp_path) == [1, 2]
    # Every rank's weights at the end are step 2's, as saved: no rank applied step 3.
    saved = load_full_state_dict(tmp_path / "checkpoint" / "step-2", ["model"])["model"]
    for rank in (0, 1):
        mine = torch.load(tmp_path / f"rank{rank}_params.pt", weights_only=True)
        assert mine.keys() == saved.keys()
        for name, local in mine.items():
            full = saved[name]
            if local.shape != full.shape:  # an FSDP shard: this rank's chunk of dim 0
                full = full.chunk(2, dim=0)[rank]
            assert torch.equal(local, full), (rank, name)


@pytest.mark.slow
def test_skipped_steps_are_counted_then_the_run_stops_with_exit_3(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "titanlite.train",
            *DIVERGING,
            "--training.skip_nonfinite_steps",
            "2",
            "--job.dump_folder",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "titanlite: error: step 5: the gradient norm is nan after 2 skipped step(s) in a row"
        )
    )
    assert proc.stderr.count("update skipped") == 2
    records = strict_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert [r["skipped_steps"] for r in records] == [0, 0, 1, 2]
    assert records[2]["grad_norm"] is None and records[3]["grad_norm"] is None  # null, not NaN
    # The LR schedule follows the step number: a skipped step uses up its slot (the update
    # itself is skipped on the device, see the saved weights below).
    # Steps 2 and 3 are at the peak (warmup 2, decay from step 4): step 4 decays although 3
    # was skipped (it would repeat the peak if a skip held the schedule back).
    assert records[3]["lr"] < records[2]["lr"] == records[1]["lr"]
    # Steps 3 and 4 were not saved (after each the run was failing: its last step skipped),
    # step 5 neither: the latest checkpoint is the last good step's.
    assert saved_steps(tmp_path) == [1, 2]
    assert proc.stderr.count("checkpoint step-4 not written: 2 of 4 step(s) skipped") == 1
    weights = load_full_state_dict(tmp_path / "checkpoint" / "step-2", ["model"])["model"]
    assert all_finite(weights)


@pytest.mark.parametrize(
    "override, toml",
    [(["--optimizer.lr", "nan"], ""), ([], "[training]\nmax_norm = inf\n")],
)
def test_nan_and_inf_settings_are_config_errors(tmp_path, override, toml):
    config = tmp_path / "c.toml"
    config.write_text(toml)
    proc = subprocess.run(
        ["bash", str(ROOT / "run_train.sh"), "--config", str(config), *override],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("titanlite: error:") and "expected a finite number" in last
