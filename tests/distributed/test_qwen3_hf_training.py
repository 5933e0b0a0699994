"""Qwen3 weights in and out of a real training run (gloo, FSDP 2, tied head): a folder that
transformers wrote is loaded by `checkpoint.initial_load_in_hf`, and with a learning rate of 0 the
run's `checkpoint.last_save_in_hf` export holds the same tensors, bit for bit, in a folder
transformers loads as Qwen3ForCausalLM."""

import json

import pytest
import torch
from helpers import CHECKPOINTED_RUN
from trainer_jobs import TrainerJobs

from models.qwen3 import FLAVORS, HF
from titanlite.data.tokenizer import BUILTIN_TOKENIZER, Tokenizer

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")


def _hf_qwen3(folder):
    args = FLAVORS["debugmodel_tied"].with_overrides(
        vocab_size=Tokenizer(BUILTIN_TOKENIZER).vocab_size, max_seq_len=64
    )
    cfg = transformers.Qwen3Config(**HF.hf_config(args, dtype=torch.float32))
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(cfg).save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_a_tied_qwen3_comes_in_and_goes_out_of_fsdp_training_unchanged(tmp_path):
    src = _hf_qwen3(tmp_path / "hf")
    group = TrainerJobs(2, tmp_path / "group")
    group.folder.mkdir()
    run = [
        *CHECKPOINTED_RUN,
        "--model.name",
        "qwen3",
        "--model.flavor",
        "debugmodel_tied",
        "--training.local_batch_size",
        "4",
        "--training.steps",
        "2",
        "--optimizer.lr",
        "0",
        "--checkpoint.initial_load_path",
        str(src),
        "--checkpoint.initial_load_in_hf",
        "--checkpoint.last_save_in_hf",
    ]
    folder = group.add("qwen3_tied_fsdp2", run)
    group.run().result("qwen3_tied_fsdp2")
    assert "loaded model from Hugging Face folder" in (group.folder / "rank0.log").read_text()
    exported = folder / "checkpoint" / "hf-step-2"
    assert json.loads((exported / "config.json").read_text())["model_type"] == "qwen3"
    want = safetensors_torch.load_file(src / "model.safetensors")
    got = safetensors_torch.load_file(exported / "model.safetensors")
    assert sorted(got) == sorted(want) and "lm_head.weight" not in got
    assert all(torch.equal(got[k], want[k]) for k in want)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(exported)
    assert type(loaded).__name__ == "Qwen3ForCausalLM"
