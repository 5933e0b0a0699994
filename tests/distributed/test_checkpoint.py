"""Checkpoints on real files and real gloo process groups: exact resume, resharding, async vs
sync content, retention, crash safety, corruption, seed checkpoints, export and conversion."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from helpers import (
    CHECKPOINTED_RUN,
    FSDP2_TP2,
    LAYOUTS,
    ROOT,
    check,
    clean_env,
    copy_step,
    free_port,
    losses_by_step,
    torchrun,
    train,
)

from titanlite.components.checkpoint.storage import complete_steps, load_full_state_dict


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["one", "fsdp2"])
def test_resume_is_bit_exact(tmp_path, layout):
    nproc, args = LAYOUTS[layout]
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    train(nproc, full, *args, "--training.steps", "10", "--checkpoint.interval", "5")
    assert complete_steps(full / "checkpoint") == [5, 10]
    copy_step(full, 5, resumed)
    proc = train(nproc, resumed, *args, "--training.steps", "10", "--checkpoint.interval", "5")
    assert "resuming at step 5" in proc.stderr
    want, got = losses_by_step(full), losses_by_step(resumed)
    assert sorted(got) == list(range(6, 11))
    assert all(got[s] == want[s] for s in range(6, 11)), (want, got)  # bit-identical


@pytest.fixture(scope="module")
def saved_2x2(tmp_path_factory):
    folder = tmp_path_factory.mktemp("saved_2x2")
    train(4, folder, *FSDP2_TP2, "--training.steps", "8", "--checkpoint.interval", "4")
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("target", ["one", "fsdp2", "tp2", "cp2"])
def test_reshard_2x2_checkpoint_onto_other_layouts(saved_2x2, tmp_path, target):
    resume_matches(saved_2x2, tmp_path, target)


def resume_matches(saved, folder, target: str) -> None:
    """Resume `saved`'s step 4 (of 8) on layout `target`: steps 5-8 within 1e-4."""
    copy_step(saved, 4, folder)
    nproc, args = LAYOUTS[target]
    train(nproc, folder, *args, "--training.steps", "8", "--checkpoint.interval", "4")
    want, got = losses_by_step(saved), losses_by_step(folder)
    assert sorted(got) == [5, 6, 7, 8]
    for s in got:
        assert abs(got[s] - want[s]) <= 1e-4 * want[s], (s, got[s], want[s])


@pytest.fixture(scope="module")
def saved_cp2(tmp_path_factory):
    folder = tmp_path_factory.mktemp("saved_cp2")
    train(2, folder, *LAYOUTS["cp2"][1], "--training.steps", "8", "--checkpoint.interval", "4")
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("target", ["one", "fsdp2"])
def test_context_parallel_checkpoint_resumes_on_other_layouts(saved_cp2, tmp_path, target):
    """CP is invisible in a checkpoint: its ranks hold FSDP shards of the same parameters and
    the same data loader position, which DCP reshards like any other layout's."""
    resume_matches(saved_cp2, tmp_path, target)


@pytest.mark.slow
def test_reshard_1_process_checkpoint_onto_2x2(tmp_path):
    one, target = tmp_path / "one", tmp_path / "target"
    train(1, one, *LAYOUTS["one"][1], "--training.steps", "8", "--checkpoint.interval", "4")
    copy_step(one, 4, target)
    train(4, target, *FSDP2_TP2, "--training.steps", "8", "--checkpoint.interval", "4")
    want, got = losses_by_step(one), losses_by_step(target)
    assert sorted(got) == [5, 6, 7, 8]
    for s in got:
        assert abs(got[s] - want[s]) <= 1e-4 * want[s]


@pytest.mark.slow
def test_async_save_equals_sync_save_and_retention(tmp_path):
    sync, asyn = tmp_path / "sync", tmp_path / "async"
    for folder, mode in ((sync, "disabled"), (asyn, "async")):
        train(
            2,
            folder,
            *LAYOUTS["fsdp2"][1],
            "--training.steps",
            "8",
            "--checkpoint.interval",
            "2",
            "--checkpoint.async_mode",
            mode,
            "--checkpoint.keep_latest_k",
            "2",
        )
    for folder in (sync, asyn):
        deadline = time.time() + 30  # retention deletes in the background
        while complete_steps(folder / "checkpoint") != [6, 8] and time.time() < deadline:
            time.sleep(0.2)
        assert complete_steps(folder / "checkpoint") == [6, 8]
    a = load_full_state_dict(sync / "checkpoint" / "step-8")
    b = load_full_state_dict(asyn / "checkpoint" / "step-8")
    _assert_same(a, b)
    manifest = json.loads((asyn / "checkpoint" / "step-8" / "manifest.json").read_text())
    assert manifest["step"] == 8 and manifest["world_size"] == 2 and len(manifest["files"]) == 3


def _assert_same(a, b, path=""):
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            _assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    elif path.endswith("elapsed_s"):
        return  # wall time differs between runs by nature
    else:
        assert a == b, path


def _kill_run(proc: subprocess.Popen, folder) -> None:
    """SIGKILL torchrun and its workers (torchrun starts them in sessions of their own, so they
    are found by the dump folder in their command line)."""
    subprocess.run(["pkill", "-KILL", "-f", str(folder)], check=False)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 30
    while subprocess.run(["pgrep", "-f", str(folder)], capture_output=True).returncode == 0:
        assert time.time() < deadline, "workers survived SIGKILL"
        subprocess.run(["pkill", "-KILL", "-f", str(folder)], check=False)
        time.sleep(0.1)


@pytest.mark.slow
def test_kill_during_async_save_resumes_previous_checkpoint(tmp_path):
    # A bigger model so that a save takes long enough to be killed in the middle of it.
    big = ["--model.dim", "512", "--model.n_layers", "8", "--model.n_heads", "8"]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        f"--master_port={free_port()}",
        "-m",
        "titanlite.train",
        *CHECKPOINTED_RUN,
        *big,
        *LAYOUTS["fsdp2"][1],
        "--training.steps",
        "200",
        "--checkpoint.interval",
        "2",
        "--checkpoint.async_mode",
        "async",
        "--job.dump_folder",
        str(tmp_path),
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    ckpt = tmp_path / "checkpoint"
    killed_during_save = False
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            partial = [p for p in ckpt.glob(".step-*.partial")] if ckpt.exists() else []
            if (
                complete_steps(ckpt)
                and partial
                and any((p / "__0_0.distcp").exists() for p in partial)
            ):
                _kill_run(proc, tmp_path)
                killed_during_save = True
                break
            time.sleep(0.005)
    finally:
        _kill_run(proc, tmp_path)
    assert killed_during_save, "never caught a save in progress"
    survivors = complete_steps(ckpt)
    assert list(ckpt.glob(".step-*.partial")), "the interrupted save left no partial folder"
    resumed = train(
        2,
        tmp_path,
        *big,
        *LAYOUTS["fsdp2"][1],
        "--training.steps",
        str(survivors[-1] + 1),
        "--checkpoint.interval",
        "100",
    )
    assert f"resuming at step {survivors[-1]}" in resumed.stderr


@pytest.fixture(scope="module")
def small_checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("small")
    train(1, folder, *LAYOUTS["one"][1], "--training.steps", "2", "--checkpoint.interval", "2")
    return folder


def _resume_error(src, tmp_path, *extra: str) -> str:
    proc = train(1, tmp_path, *LAYOUTS["one"][1], "--training.steps", "4", *extra, expect_ok=False)
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("titanlite: error:")]
    assert lines, proc.stderr[-3000:]
    return lines[0]


@pytest.mark.slow
def test_corrupted_truncated_and_mismatched_checkpoints_are_clear_errors(
    small_checkpoint, tmp_path
):
    for damage in ("corrupt", "truncate"):
        folder = tmp_path / damage
        copy_step(small_checkpoint, 2, folder)
        data = folder / "checkpoint" / "step-2" / "__0_0.distcp"
        raw = bytearray(data.read_bytes())
        if damage == "corrupt":
            raw[len(raw) // 2] ^= 0xFF
        else:
            raw = raw[: len(raw) - 100]
        data.write_bytes(bytes(raw))
        error = _resume_error(small_checkpoint, folder)
        assert str(data) in error and ("corrupted" if damage == "corrupt" else "truncated") in error
        check_cli = subprocess.run(
            [sys.executable, "-m", "titanlite.checkpoint", "verify", str(data.parent)],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert check_cli.returncode == 1 and str(data) in check_cli.stdout
    folder = tmp_path / "shapes"
    copy_step(small_checkpoint, 2, folder)
    error = _resume_error(small_checkpoint, folder, "--model.n_layers", "2", "--model.dim", "128")
    assert (
        "model key 'tok_embeddings.weight' has shape (512, 256), the model (as configured: "
        "llama3 debugmodel) has (512, 128)" in error
    )


@pytest.mark.slow
def test_newer_checkpoint_of_another_run_is_never_overwritten(small_checkpoint, tmp_path):
    copy_step(small_checkpoint, 2, tmp_path)
    shutil.copytree(tmp_path / "checkpoint" / "step-2", tmp_path / "checkpoint" / "step-4")
    error = _resume_error(small_checkpoint, tmp_path, "--checkpoint.load_step", "2")
    assert "holds step-4, newer than step-2" in error and "--checkpoint.overwrite" in error
    error = _resume_error(small_checkpoint, tmp_path, "--checkpoint.load_step", "3")
    assert "load_step = 3" in error


@pytest.mark.slow
def test_seed_checkpoint_gives_the_same_start_on_every_layout(tmp_path):
    seed = tmp_path / "seed"
    check(
        torchrun(
            1,
            ["-m", "titanlite.train"],
            [
                *CHECKPOINTED_RUN,
                "--job.dump_folder",
                str(seed),
                "--checkpoint.create_seed_checkpoint",
                "--training.seed",
                "1234",
            ],
        )
    )
    assert complete_steps(seed / "checkpoint") == [0]
    first = {}
    for name in ("one", "fsdp2_tp2"):
        folder = tmp_path / name
        copy_step(seed, 0, folder)
        nproc, args = LAYOUTS[name]
        train(nproc, folder, *args, "--training.steps", "1", "--checkpoint.interval", "100")
        first[name] = losses_by_step(folder)[1]
    plain = tmp_path / "plain"
    train(1, plain, *LAYOUTS["one"][1], "--training.steps", "1", "--checkpoint.interval", "100")
    assert abs(first["one"] - first["fsdp2_tp2"]) <= 1e-5 * first["one"]
    assert (
        first["one"] != losses_by_step(plain)[1]
    )  # the seed checkpoint's weights were really used


@pytest.mark.slow
def test_weights_only_export_and_conversion_round_trip(tmp_path):
    train(
        2,
        tmp_path,
        *LAYOUTS["fsdp2"][1],
        "--training.steps",
        "2",
        "--checkpoint.interval",
        "100",
        "--checkpoint.last_save_model_weights_only",
        "--checkpoint.export_dtype",
        "bfloat16",
    )
    step = tmp_path / "checkpoint" / "step-2"
    exported = load_full_state_dict(step)
    assert set(exported) == {"model"}
    assert all(t.dtype == torch.bfloat16 for t in exported["model"].values())
    out_pt, back = tmp_path / "model.pt", tmp_path / "back" / "step-0"
    for args in (
        ["dcp-to-torch", str(step), str(out_pt)],
        ["torch-to-dcp", str(out_pt), str(back)],
    ):
        subprocess.run(
            [sys.executable, "scripts/convert_checkpoint.py", *args],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
    single = torch.load(out_pt, weights_only=True)
    _assert_same(single, exported["model"])
    _assert_same(load_full_state_dict(back)["model"], exported["model"])
