"""Qwen3 equals Hugging Face's Qwen3ForCausalLM: logits through the adapter in both directions
(fp32, <= 1e-5), the round trip bit-exact, and the converters (hf-to-dcp, dcp-to-hf) on a folder
transformers wrote and loads back, tied and untied."""

import dataclasses
import json

import pytest
import torch

from models.qwen3 import FLAVORS, HF, Qwen3
from titanlite.components.checkpoint import hf as hf_checkpoint
from titanlite.components.checkpoint.folder import CheckpointError
from titanlite.components.checkpoint.record import model_config_record
from titanlite.components.checkpoint.storage import load_full_state_dict, save_full_state_dict

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

VOCAB, SEQ = 512, 48
TIED = {"untied": False, "tied": True}


def _args(tied: bool, **overrides):
    return dataclasses.replace(
        FLAVORS["debugmodel"],
        vocab_size=VOCAB,
        max_seq_len=SEQ,
        tie_word_embeddings=tied,
        **overrides,
    )


def _hf_model(tied: bool, seed: int = 0):
    """A random Qwen3ForCausalLM of the debug shape: std 0.05 so attention patterns matter, norms
    away from 1 so that a norm mix-up (or a wrongly permuted q/k norm) shows."""
    a = _args(tied)
    cfg = transformers.Qwen3Config(**HF.hf_config(a, dtype=torch.float32))
    cfg.initializer_range = 0.05
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    return model.eval()


def _to_titanlite(hf_sd: dict, args) -> dict:
    shapes = HF.state_dict_shapes(args)
    tied = args.tie_word_embeddings
    return {k: HF.from_hf_tensor(k, hf_sd[HF.source_name(k, tied)], args) for k in shapes}


def _tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(0))


def _gap(model: Qwen3, hf_model) -> float:
    with torch.no_grad():
        return (model(_tokens()) - hf_model(_tokens()).logits).abs().max().item()


@pytest.mark.parametrize("tie", list(TIED))
def test_hf_weights_give_titanlite_the_logits_of_transformers(tie):
    hf_model = _hf_model(TIED[tie])
    args = HF.args_from_hf_config(hf_model.config.to_dict())
    assert args == _args(TIED[tie])
    model = Qwen3(args).eval()
    model.load_state_dict(_to_titanlite(hf_model.state_dict(), args))
    gap = _gap(model, hf_model)
    print(f"HF -> titanlite ({tie}): max |logits gap| {gap:.2e}")
    assert gap <= 1e-5


@pytest.mark.parametrize("tie", list(TIED))
def test_titanlite_weights_give_transformers_its_logits_and_round_trip_exactly(tie):
    args = _args(TIED[tie])
    torch.manual_seed(1)
    model = Qwen3(args).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.05 * torch.randn_like(p))
    sd = model.state_dict()
    hf_sd = {HF.to_hf_name(k): HF.to_hf_tensor(k, v, args) for k, v in sd.items()}
    hf_model = _hf_model(TIED[tie], seed=5)
    missing, unexpected = hf_model.load_state_dict(hf_sd, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"} and (missing != []) == TIED[tie]
    gap = _gap(model, hf_model)
    print(f"titanlite -> HF ({tie}): max |logits gap| {gap:.2e}")
    assert gap <= 1e-5
    back = _to_titanlite(hf_sd, args)
    assert back.keys() == sd.keys()
    assert all(torch.equal(back[k], sd[k]) for k in sd)


@pytest.mark.parametrize("tie", list(TIED))
def test_converters_round_trip_a_transformers_folder_bit_exactly(tmp_path, tie):
    hf_model = _hf_model(TIED[tie])
    src = tmp_path / "src"
    hf_model.save_pretrained(src)
    step = tmp_path / "dcp" / "step-0"
    hf_checkpoint.hf_to_dcp(src, step)
    back = tmp_path / "back"
    hf_checkpoint.dcp_to_hf(step, back)
    cfg = json.loads((back / "config.json").read_text())
    assert (cfg["model_type"], cfg["architectures"], cfg["tie_word_embeddings"]) == (
        "qwen3",
        ["Qwen3ForCausalLM"],
        TIED[tie],
    )
    want = safetensors_torch.load_file(src / "model.safetensors")
    got = safetensors_torch.load_file(back / "model.safetensors")
    assert sorted(got) == sorted(want) and ("lm_head.weight" in got) != TIED[tie]
    assert all(torch.equal(got[k], want[k]) for k in want)
    # transformers loads the export; titanlite's model from the DCP checkpoint gives its logits
    loaded = transformers.AutoModelForCausalLM.from_pretrained(back, dtype=torch.float32).eval()
    assert type(loaded).__name__ == "Qwen3ForCausalLM"
    model = Qwen3(HF.args_from_hf_config(cfg)).eval()
    model.load_state_dict(load_full_state_dict(step)["model"])
    assert _gap(model, loaded) <= 1e-5


def test_a_trained_checkpoint_exports_through_its_manifest(tmp_path):
    args = _args(False)
    model = Qwen3(args)
    model.init_weights(seed=0)
    step = tmp_path / "run" / "checkpoint" / "step-3"
    info = {"step": 3, "model_config": model_config_record("qwen3", "debugmodel", args, None)}
    save_full_state_dict({"model": model.state_dict()}, step, info)
    hf_checkpoint.dcp_to_hf(step, tmp_path / "hf")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert _gap(model.eval(), loaded) <= 1e-5


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"use_sliding_window": True}, "use_sliding_window = True"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "'yarn'"),
        ({"attention_bias": True}, "attention_bias = True"),
    ],
)
def test_configs_titanlite_cannot_represent_name_the_field(edit, message):
    from models.spec import HFConfigError

    cfg = HF.hf_config(_args(False), dtype=torch.float32) | edit
    with pytest.raises(HFConfigError, match=message):
        HF.args_from_hf_config(cfg)


def test_a_moe_folder_with_an_integer_expert_is_refused_in_one_line(tmp_path):
    args = dataclasses.replace(FLAVORS["debugmodel_moe"], vocab_size=VOCAB, n_layers=1)
    cfg = transformers.Qwen3MoeConfig(**HF.hf_config(args, dtype=torch.float32))
    transformers.Qwen3MoeForCausalLM(cfg).save_pretrained(tmp_path / "src")
    path = tmp_path / "src" / "model.safetensors"
    tensors = safetensors_torch.load_file(path)
    expert = next(n for n in tensors if ".experts." in n)
    tensors[expert] = tensors[expert].to(torch.int16)
    safetensors_torch.save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as e:
        hf_checkpoint.hf_to_dcp(tmp_path / "src", tmp_path / "dcp")
    assert f"tensor {expert} has dtype int16, the model needs floating weights (float32)" in str(
        e.value
    )
    assert not (tmp_path / "dcp").exists()
