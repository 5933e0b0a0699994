"""Qwen3 weights in and out of a real training run (gloo, FSDP 2; the tied dense debug model and
the MoE one, in one launched group): a folder that transformers wrote is loaded by
`checkpoint.initial_load_in_hf`, and with a learning rate of 0 the run's
`checkpoint.last_save_in_hf` export holds the same tensors, bit for bit, in a folder
transformers loads as Qwen3ForCausalLM / Qwen3MoeForCausalLM. The MoE's experts are sharded on
their first dimension, so each rank reads its own experts' per-expert tensors."""

import json

import pytest
import torch
from helpers import CHECKPOINTED_RUN
from trainer_jobs import TrainerJobs

from models.qwen3 import FLAVORS, HF
from titanlite.data.tokenizer import BUILTIN_TOKENIZER, Tokenizer

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")


# flavor -> transformers' class of it
MODELS = {"debugmodel_tied": "Qwen3ForCausalLM", "debugmodel_moe": "Qwen3MoeForCausalLM"}


def _hf_qwen3(folder, flavor):
    args = FLAVORS[flavor].with_overrides(
        vocab_size=Tokenizer(BUILTIN_TOKENIZER).vocab_size, max_seq_len=64, n_layers=2
    )  # CHECKPOINTED_RUN's two blocks
    cfg = HF.hf_config(args, dtype=torch.float32)
    config_cls = transformers.Qwen3MoeConfig if args.moe_experts else transformers.Qwen3Config
    torch.manual_seed(0)
    getattr(transformers, MODELS[flavor])(config_cls(**cfg)).save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_qwen3_dense_and_moe_come_in_and_go_out_of_fsdp_training_unchanged(tmp_path):
    group = TrainerJobs(2, tmp_path / "group")
    group.folder.mkdir()
    sources, folders = {}, {}
    for flavor in MODELS:
        sources[flavor] = src = _hf_qwen3(tmp_path / f"hf_{flavor}", flavor)
        run = [
            *CHECKPOINTED_RUN,
            "--model.name",
            "qwen3",
            "--model.flavor",
            flavor,
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
        folders[flavor] = group.add(f"qwen3_{flavor}_fsdp2", run)
    group.run()
    assert "loaded model from Hugging Face folder" in (group.folder / "rank0.log").read_text()
    for flavor, architecture in MODELS.items():
        group.result(f"qwen3_{flavor}_fsdp2")
        exported = folders[flavor] / "checkpoint" / "hf-step-2"
        model_type = json.loads((exported / "config.json").read_text())["model_type"]
        assert model_type == ("qwen3_moe" if "moe" in flavor else "qwen3")
        want = safetensors_torch.load_file(sources[flavor] / "model.safetensors")
        got = safetensors_torch.load_file(exported / "model.safetensors")
        assert sorted(got) == sorted(want)
        assert ("lm_head.weight" in got) == ("moe" in flavor)  # the dense one is tied
        assert all(torch.equal(got[k], want[k]) for k in want), flavor
        loaded = transformers.AutoModelForCausalLM.from_pretrained(exported)
        assert type(loaded).__name__ == architecture
