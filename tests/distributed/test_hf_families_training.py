"""Qwen3 and DeepSeek-V3 weights in and out of a real training run (gloo, FSDP 2; Qwen3's tied
dense debug model and its MoE one, DeepSeek-V3's debug model without MTP, in one launched
group): a folder that transformers wrote is loaded by
`checkpoint.initial_load_in_hf`, and with a learning rate of 0 the run's
`checkpoint.last_save_in_hf` export holds the same tensors, bit for bit, in a folder
transformers loads as Qwen3ForCausalLM / Qwen3MoeForCausalLM. The MoE's experts are sharded on
their first dimension, so each rank reads its own experts' per-expert tensors."""

import json

import pytest
import torch
from helpers import CHECKPOINTED_RUN
from trainer_jobs import TrainerJobs

from models import deepseek_v3, qwen3
from titanlite.data.tokenizer import BUILTIN_TOKENIZER, Tokenizer

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")


# (family, flavor) -> transformers' class of it, its config class, its model_type
MODELS = {
    ("qwen3", "debugmodel_tied"): ("Qwen3ForCausalLM", "Qwen3Config", "qwen3"),
    ("qwen3", "debugmodel_moe"): ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", "qwen3_moe"),
    # transformers writes no MTP module, though its config counts one: the folder imports as
    # the main model
    ("deepseek_v3", "debugmodel"): ("DeepseekV3ForCausalLM", "DeepseekV3Config", "deepseek_v3"),
}
FAMILIES = {"qwen3": qwen3, "deepseek_v3": deepseek_v3}
# The expert bias moves whatever the learning rate: held still, so that the export must equal
# the import.
STILL = {"deepseek_v3": ["--model.mtp_depth", "0", "--model.moe_bias_update_rate", "0"]}


def _hf_folder(folder, family, flavor):
    module = FAMILIES[family]
    args = module.FLAVORS[flavor].with_overrides(
        vocab_size=Tokenizer(BUILTIN_TOKENIZER).vocab_size,
        max_seq_len=64,
        n_layers=2,  # CHECKPOINTED_RUN's two blocks
    )
    cfg = module.HF.hf_config(args, dtype=torch.float32)
    model_cls, config_cls, _ = MODELS[(family, flavor)]
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**cfg))
    model.save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_qwen3_and_deepseek_v3_come_in_and_go_out_of_fsdp_training_unchanged(tmp_path):
    group = TrainerJobs(2, tmp_path / "group")
    group.folder.mkdir()
    sources, folders = {}, {}
    for family, flavor in MODELS:
        key = f"{family}_{flavor}"
        sources[key] = src = _hf_folder(tmp_path / f"hf_{key}", family, flavor)
        run = [
            *CHECKPOINTED_RUN,
            *STILL.get(family, []),
            "--model.name",
            family,
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
        folders[key] = group.add(f"{key}_fsdp2", run)
    group.run()
    assert "loaded model from Hugging Face folder" in (group.folder / "rank0.log").read_text()
    for (family, flavor), (architecture, _, model_type) in MODELS.items():
        key = f"{family}_{flavor}"
        group.result(f"{key}_fsdp2")
        exported = folders[key] / "checkpoint" / "hf-step-2"
        assert json.loads((exported / "config.json").read_text())["model_type"] == model_type
        want = safetensors_torch.load_file(sources[key] / "model.safetensors")
        got = safetensors_torch.load_file(exported / "model.safetensors")
        assert sorted(got) == sorted(want)
        assert ("lm_head.weight" in got) == (flavor != "debugmodel_tied")  # tied: no head
        assert [k for k in want if not torch.equal(got[k], want[k])] == [], key
        loaded = transformers.AutoModelForCausalLM.from_pretrained(exported)
        assert type(loaded).__name__ == architecture
