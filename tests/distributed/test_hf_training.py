"""Hugging Face weights in and out of real training runs (gloo):
`checkpoint.initial_load_in_hf` starts FSDP 2 x TP 2 where one process starts, and
`checkpoint.last_save_in_hf` exports what the offline converter writes, byte for byte."""

import filecmp
import json
import subprocess
import sys

import pytest
import torch
from helpers import CHECKPOINTED_RUN, ROOT, check, clean_env, losses_by_step, make_hf_llama
from helpers import LAYOUTS as ALL_LAYOUTS
from trainer_jobs import TrainerJobs

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

STEPS = 3
LAYOUTS = {name: ALL_LAYOUTS[name] for name in ("one", "fsdp2_tp2")}


@pytest.mark.slow
def test_hf_start_matches_across_layouts_and_final_export_is_the_converters(tmp_path):
    src = make_hf_llama(tmp_path / "hf", n_kv_heads=4, n_layers=2)  # TINY_RUN's two blocks
    hf_args = [
        "--model.n_kv_heads",
        "4",
        "--training.steps",
        str(STEPS),
        "--checkpoint.initial_load_path",
        str(src),
        "--checkpoint.initial_load_in_hf",
        "--checkpoint.last_save_in_hf",
    ]
    got = {}
    for name, (nproc, args) in LAYOUTS.items():
        group = TrainerJobs(nproc, tmp_path / f"group_{name}")
        group.folder.mkdir()
        folder = group.add(name, [*CHECKPOINTED_RUN, *args, *hf_args])
        group.run().result(name)
        assert "loaded model from Hugging Face folder" in (group.folder / "rank0.log").read_text()
        got[name] = losses_by_step(folder)
    assert sorted(got["one"]) == list(range(1, STEPS + 1))
    for step, loss in got["one"].items():
        assert abs(got["fsdp2_tp2"][step] - loss) <= 1e-4, (step, got)

    ckpt = folder / "checkpoint"  # FSDP 2 x TP 2's
    exported, converted = ckpt / f"hf-step-{STEPS}", tmp_path / "converted"
    args = ["dcp-to-hf", str(ckpt / f"step-{STEPS}"), str(converted)]
    check(
        subprocess.run(
            [sys.executable, "scripts/convert_checkpoint.py", *args],
            cwd=ROOT,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
    )
    names = sorted(p.name for p in converted.iterdir())
    assert names == sorted(p.name for p in exported.iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(names)
    for n in names:
        assert filecmp.cmp(converted / n, exported / n, shallow=False), n
    ours = safetensors_torch.load_file(exported / "model.safetensors")
    theirs = safetensors_torch.load_file(converted / "model.safetensors")
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert json.loads((exported / "config.json").read_text()) == json.loads(
        (converted / "config.json").read_text()
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32)
    assert torch.equal(model.lm_head.weight.detach(), ours["lm_head.weight"])
    # Trained: the export is not the folder the run started from.
    start = safetensors_torch.load_file(src / "model.safetensors")
    assert not torch.equal(start["lm_head.weight"], ours["lm_head.weight"])
