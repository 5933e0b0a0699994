"""Checkpoints on real files and real gloo process groups: exact resume, resharding, async vs
sync content, retention, crash safety, corruption, seed checkpoints, export and conversion."""

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from helpers import (
    CHECKPOINTED_RUN,
    LAYOUTS,
    MUON,
    ROOT,
    clean_env,
    copy_step,
    free_port,
    losses_by_step,
    train,
)
from trainer_jobs import TrainerJobs

from titanlite.components.checkpoint.folder import complete_steps
from titanlite.components.checkpoint.storage import load_full_state_dict

QWEN3_TIED = ("--model.name", "qwen3", "--model.flavor", "debugmodel_tied")
# The expert bias moves 0.01 a step, so that a lost or reset bias shows in the next steps.
QWEN3_MOE_BIAS = ("--model.name", "qwen3", "--model.flavor", "debugmodel_moe")
QWEN3_MOE_BIAS += (
    "--model.moe_load_balance",
    "expert_bias",
    "--model.moe_bias_update_rate",
    "0.01",
)

DEEPSEEK = ("--model.name", "deepseek_v3", "--model.moe_bias_update_rate", "0.01")


def _run_args(layout: str, steps: int, interval: int, *extra: str) -> list[str]:
    return [
        *CHECKPOINTED_RUN,
        *LAYOUTS[layout][1],
        "--training.steps",
        str(steps),
        "--checkpoint.interval",
        str(interval),
        *extra,
    ]


# The runs that save: name -> (layout, steps, checkpoint interval, extra arguments).
SAVES = {
    "full_one": ("one", 6, 3, ()),
    "full_fsdp2": ("fsdp2", 6, 3, ()),
    "save_cp2": ("cp2", 6, 3, ()),
    "save_2x2": ("fsdp2_tp2", 6, 3, ()),
    "small": ("one", 2, 2, ()),  # what the damage and overwrite tests copy
    **{
        f"retention_{mode}": (
            "fsdp2",
            6,
            2,
            ("--checkpoint.async_mode", mode, "--checkpoint.keep_latest_k", "2"),
        )
        for mode in ("disabled", "async")
    },
    "export": (
        "fsdp2",
        2,
        100,
        ("--checkpoint.last_save_model_weights_only", "--checkpoint.export_dtype", "bfloat16"),
    ),
    # Qwen3 with its head tied to the embedding: the table is one parameter in the checkpoint.
    "qwen3_one": ("one", 6, 3, QWEN3_TIED),
    "qwen3_fsdp2": ("fsdp2", 6, 3, QWEN3_TIED),
    # Qwen3 MoE: the expert bias, a buffer, is in the checkpoint beside the weights.
    "moe_one": ("one", 6, 3, QWEN3_MOE_BIAS),
    # Expert parallel: the experts split over 2 ranks in the checkpoint; its last save is also
    # exported to Hugging Face by the ranks.
    "moe_ep2": ("ep2", 6, 3, (*QWEN3_MOE_BIAS, "--checkpoint.last_save_in_hf")),
    # DeepSeek-V3 on EP 4: its MTP module and expert biases (the MTP block's too) resume
    # bit-exactly and reshard to one process.
    "moe_deepseek_ep4": ("ep4", 6, 3, DEEPSEEK),
    "full_muon_fsdp2": ("fsdp2", 6, 3, MUON),
}
SEED = [*CHECKPOINTED_RUN, "--checkpoint.create_seed_checkpoint", "--training.seed", "1234"]
# The runs that start from a copy of another's checkpoint: name -> (source, its step, layout,
# steps, interval).
RESUMES = {
    "resumed_one": ("full_one", 3, "one", 6, 3),
    "resumed_fsdp2": ("full_fsdp2", 3, "fsdp2", 6, 3),
    "2x2_to_one": ("save_2x2", 3, "one", 6, 3),
    "2x2_to_fsdp2": ("save_2x2", 3, "fsdp2", 6, 3),
    "2x2_to_tp2": ("save_2x2", 3, "tp2", 6, 3),
    "2x2_to_cp2": ("save_2x2", 3, "cp2", 6, 3),
    # CP is invisible in a checkpoint: its ranks hold FSDP shards of the same parameters and
    # the same data loader position, which DCP reshards like any other layout's.
    "cp2_to_one": ("save_cp2", 3, "one", 6, 3),
    "one_to_2x2": ("full_one", 3, "fsdp2_tp2", 6, 3),
    "seed_one": ("seed", 0, "one", 1, 100),
    "seed_2x2": ("seed", 0, "fsdp2_tp2", 1, 100),
    "qwen3_one_to_2x2": ("qwen3_one", 3, "fsdp2_tp2", 6, 3),
    "qwen3_fsdp2_to_one": ("qwen3_fsdp2", 3, "one", 6, 3),
    "moe_one_to_2x2": ("moe_one", 3, "fsdp2_tp2", 6, 3),
    # Saved on EP 2, in the 2-process phase: its 4-process resumes join the other 4-process
    # runs (one process group fewer than a save on 4 ranks would need).
    "moe_resumed_ep2": ("moe_ep2", 3, "ep2", 6, 3),
    "moe_ep2_to_ep4": ("moe_ep2", 3, "ep4", 6, 3),
    "moe_ep2_to_ep2_fsdp4": ("moe_ep2", 3, "ep2_fsdp4", 6, 3),
    "moe_ep2_to_fsdp2": ("moe_ep2", 3, "fsdp2", 6, 3),
    "moe_ep2_to_one": ("moe_ep2", 3, "one", 6, 3),
    "moe_deepseek_resumed_ep4": ("moe_deepseek_ep4", 3, "ep4", 6, 3),
    "moe_deepseek_ep4_to_one": ("moe_deepseek_ep4", 3, "one", 6, 3),
    "resumed_muon_fsdp2": ("full_muon_fsdp2", 3, "fsdp2", 6, 3),
    "muon_fsdp2_to_one": ("full_muon_fsdp2", 3, "one", 6, 3),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, TrainerJobs]:
    """Every run of this module that a test reads afterwards, {name: its group}: one process
    group per world size and phase (the saves of 1 and 2 processes; the 4-process saves with the
    4-process resumes of earlier saves; the 4-process resumes of those; then the 2- and
    1-process resumes), each resume of a copy of the step it resumes, as a relaunch finds it."""
    root = tmp_path_factory.mktemp("runs")
    groups: dict[str, TrainerJobs] = {}
    count = itertools.count()

    def phase(nproc: int, saves: list[str], resumes: list[str]) -> None:
        group = TrainerJobs(nproc, root / f"phase{next(count)}")
        group.folder.mkdir()
        for name in saves:
            if name == "seed":
                group.add(name, SEED)
            else:
                layout, steps, interval, extra = SAVES[name]
                group.add(name, _run_args(layout, steps, interval, *extra))
        for name in resumes:
            src, step, layout, steps, interval = RESUMES[name]
            extra = SAVES[src][3] if src in SAVES else ()  # the model the source trained
            run = _run_args(layout, steps, interval, *extra)
            copy_step(groups[src].folder / src, step, group.add(name, run))
        group.run()
        groups.update(dict.fromkeys(group.jobs, group))

    by_world = {n: [k for k, v in SAVES.items() if LAYOUTS[v[0]][0] == n] for n in (1, 2, 4)}
    phase(1, [*by_world[1], "seed"], [])
    phase(2, by_world[2], [])
    pending = dict(RESUMES)
    for nproc, saves in ((4, by_world[4]), (4, []), (2, []), (1, [])):
        ready = [k for k, v in pending.items() if LAYOUTS[v[2]][0] == nproc and v[0] in groups]
        if saves or ready:
            phase(nproc, saves, ready)
        for name in ready:
            del pending[name]
    assert not pending, pending
    return groups


def _folder(runs: dict[str, TrainerJobs], name: str) -> Path:
    runs[name].result(name)  # the run finished
    return runs[name].folder / name


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["one", "fsdp2", "muon_fsdp2"])
def test_resume_is_bit_exact(runs, layout):
    full, resumed = _folder(runs, f"full_{layout}"), _folder(runs, f"resumed_{layout}")
    assert complete_steps(full / "checkpoint") == [3, 6]
    assert runs[f"resumed_{layout}"].result(f"resumed_{layout}")["resumed_from"] == 3
    want, got = losses_by_step(full), losses_by_step(resumed)
    assert sorted(got) == [4, 5, 6]
    assert all(got[s] == want[s] for s in got), (want, got)  # bit-identical


@pytest.mark.slow
@pytest.mark.parametrize("name", [k for k in RESUMES if "_to_" in k])
def test_resharded_resume_matches_the_saved_run(runs, name):
    """Resume a run's step 3 (of 6) on another layout: steps 4-6 within 1e-4 of the run's."""
    src = RESUMES[name][0]
    want, got = losses_by_step(_folder(runs, src)), losses_by_step(_folder(runs, name))
    assert runs[name].result(name)["resumed_from"] == 3
    assert sorted(got) == [4, 5, 6]
    for s in got:
        assert abs(got[s] - want[s]) <= 1e-4 * want[s], (s, got[s], want[s])


@pytest.mark.slow
@pytest.mark.parametrize("name", [k for k in RESUMES if k.startswith("moe_")])
def test_moe_resume_carries_the_expert_bias(runs, name):
    """An MoE's step 3, resumed on its own layout or resharded: the expert bias it loads is the
    saved one, and at step 6 it equals the saved run's exactly (each step moves it by +-0.01
    from integer counts, so one lost, reset or differently routed step would show); the same
    layout resumes bit-exactly."""
    src = RESUMES[name][0]
    saved, resumed = _folder(runs, src), _folder(runs, name)
    at_3 = _expert_biases(saved, 3)
    assert at_3 and all(bias.abs().max() > 0 for bias in at_3.values()), at_3
    want, got = _expert_biases(saved, 6), _expert_biases(resumed, 6)
    assert set(got) == set(want)
    for key in want:
        assert torch.equal(got[key], want[key]), (key, got[key], want[key])
    if RESUMES[name][2] == SAVES[src][0]:
        want_losses, got_losses = losses_by_step(saved), losses_by_step(resumed)
        assert sorted(got_losses) == [4, 5, 6]
        assert all(got_losses[s] == want_losses[s] for s in got_losses), (want_losses, got_losses)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resumed_muon_fsdp2", "muon_fsdp2_to_one"])
def test_muon_resume_carries_the_momentum_buffers(runs, name):
    """Muon's step 3 on FSDP 2, resumed on FSDP 2 or one process: at step 6 every momentum
    buffer, AdamW moment and weight equals the saved run's (exactly on its own layout, within
    1e-4 in norm resharded); a buffer lost or reset on load would differ by far more."""
    src = RESUMES[name][0]
    want = load_full_state_dict(_folder(runs, src) / "checkpoint" / "step-6")
    got = load_full_state_dict(_folder(runs, name) / "checkpoint" / "step-6")
    buffers = {k.split(".", 1)[1] for k in want["optimizer"] if k.endswith(".momentum_buffer")}
    matrices = {
        f"{k}.momentum_buffer"
        for k, v in want["model"].items()
        if v.dim() == 2 and k not in ("tok_embeddings.weight", "output.weight")
    }
    assert buffers == matrices and len(matrices) == 14, (sorted(buffers), sorted(matrices))
    exact = RESUMES[name][2] == SAVES[src][0]
    for part in ("model", "optimizer"):
        assert set(got[part]) == set(want[part]), part
        for key, w in want[part].items():
            if not isinstance(w, torch.Tensor) or not w.is_floating_point():
                continue
            g = got[part][key]
            error = ((g - w).norm() / w.norm().clamp(min=1e-30)).item()
            assert error == 0.0 if exact else error <= 1e-4, (part, key, error)


def _expert_biases(folder: Path, step: int) -> dict[str, torch.Tensor]:
    model = load_full_state_dict(folder / "checkpoint" / f"step-{step}")["model"]
    return {k: v for k, v in model.items() if k.endswith("expert_bias")}


@pytest.mark.slow
def test_hf_export_of_an_expert_parallel_run_equals_the_one_process_conversion(runs, tmp_path):
    """The EP 2 run's ranks exported its last step to Hugging Face; one process converting the
    same checkpoint (scripts/convert_checkpoint.py dcp-to-hf) writes the same tensors."""
    from safetensors.torch import load_file

    folder = _folder(runs, "moe_ep2") / "checkpoint"
    converted = tmp_path / "hf"
    subprocess.run(
        [
            sys.executable,
            "scripts/convert_checkpoint.py",
            "dcp-to-hf",
            folder / "step-6",
            converted,
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    exported, want = (
        _safetensors(folder / "hf-step-6", load_file),
        _safetensors(converted, load_file),
    )
    assert any(".experts." in k for k in want), sorted(want)[:5]
    _assert_same(exported, want)


def _safetensors(folder: Path, load_file) -> dict[str, torch.Tensor]:
    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


@pytest.mark.slow
def test_async_save_equals_sync_save_and_retention(runs):
    sync, asyn = _folder(runs, "retention_disabled"), _folder(runs, "retention_async")
    for folder in (sync, asyn):
        deadline = time.time() + 30  # retention deletes in the background
        while complete_steps(folder / "checkpoint") != [4, 6] and time.time() < deadline:
            time.sleep(0.2)
        assert complete_steps(folder / "checkpoint") == [4, 6]
    a = load_full_state_dict(sync / "checkpoint" / "step-6")
    b = load_full_state_dict(asyn / "checkpoint" / "step-6")
    _assert_same(a, b)
    manifest = json.loads((asyn / "checkpoint" / "step-6" / "manifest.json").read_text())
    assert manifest["step"] == 6 and manifest["world_size"] == 2 and len(manifest["files"]) == 3


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


def _damage(folder: Path, how: str) -> Path:
    data = folder / "checkpoint" / "step-2" / "__0_0.distcp"
    raw = bytearray(data.read_bytes())
    if how == "corrupt":
        raw[len(raw) // 2] ^= 0xFF
    else:
        raw = raw[: len(raw) - 100]
    data.write_bytes(bytes(raw))
    return data


# Resumes that must stop with one line: name -> (how the copied step-2 is changed, arguments).
BAD_RESUMES = {
    "corrupt": ("corrupt", []),
    "truncate": ("truncate", []),
    "shapes": (None, ["--model.n_layers", "2", "--model.dim", "128"]),
    "newer_than_load_step": ("newer", ["--checkpoint.load_step", "2"]),
    "missing_load_step": ("newer", ["--checkpoint.load_step", "3"]),
}


@pytest.fixture(scope="module")
def resume_errors(runs, tmp_path_factory) -> dict[str, tuple[str, Path]]:
    """{name: (the first error line, the damaged file)}: each case a copy of the small run's
    step 2 resumed by `python -m titanlite.train` under torchrun, two at a time."""
    small, root = _folder(runs, "small"), tmp_path_factory.mktemp("bad_resumes")
    damaged = {}
    for name, (how, _) in BAD_RESUMES.items():
        copy_step(small, 2, root / name)
        if how == "newer":  # another run's later checkpoint in the same folder
            shutil.copytree(
                root / name / "checkpoint" / "step-2", root / name / "checkpoint" / "step-4"
            )
        elif how:
            damaged[name] = _damage(root / name, how)

    def resume(name: str) -> str:
        extra = BAD_RESUMES[name][1]
        proc = train(
            1, root / name, *LAYOUTS["one"][1], "--training.steps", "4", *extra, expect_ok=False
        )
        assert proc.returncode != 0
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("titanlite: error:")]
        assert lines, proc.stderr[-3000:]
        return lines[0]

    with ThreadPoolExecutor(2) as pool:
        lines = dict(zip(BAD_RESUMES, pool.map(resume, BAD_RESUMES)))
    return {name: (line, damaged.get(name)) for name, line in lines.items()}


@pytest.mark.slow
def test_corrupted_truncated_and_mismatched_checkpoints_are_clear_errors(resume_errors):
    for damage in ("corrupt", "truncate"):
        error, data = resume_errors[damage]
        assert str(data) in error and ("corrupted" if damage == "corrupt" else "truncated") in error
        check_cli = subprocess.run(
            [sys.executable, "-m", "titanlite.checkpoint", "verify", str(data.parent)],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert check_cli.returncode == 1 and str(data) in check_cli.stdout
    # The shape-changing field is named, from the manifest's record of the model.
    shapes = resume_errors["shapes"][0]
    assert "step 2" in shapes and "saved with dim = 256 (checkpoint) vs 128 (configured)" in shapes


@pytest.mark.slow
def test_newer_checkpoint_of_another_run_is_never_overwritten(resume_errors):
    error = resume_errors["newer_than_load_step"][0]
    assert "holds step-4, newer than step-2" in error and "--checkpoint.overwrite" in error
    assert "load_step = 3" in resume_errors["missing_load_step"][0]


@pytest.mark.slow
def test_seed_checkpoint_gives_the_same_start_on_every_layout(runs):
    assert complete_steps(_folder(runs, "seed") / "checkpoint") == [0]
    first = {name: losses_by_step(_folder(runs, name))[1] for name in ("seed_one", "seed_2x2")}
    assert abs(first["seed_one"] - first["seed_2x2"]) <= 1e-5 * first["seed_one"]
    # The seed checkpoint's weights were really used: a run from the default seed's (full_one,
    # whose step 1 is computed before any update) starts elsewhere.
    assert first["seed_one"] != losses_by_step(_folder(runs, "full_one"))[1]


@pytest.mark.slow
def test_weights_only_export_and_conversion_round_trip(runs, tmp_path):
    step = _folder(runs, "export") / "checkpoint" / "step-2"
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
