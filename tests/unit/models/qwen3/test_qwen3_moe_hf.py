"""Qwen3 MoE through Hugging Face files: a folder transformers wrote (per-expert tensors, the
hub's format) imports to titanlite's logits, titanlite's export loads in
AutoModelForCausalLM with its logits (fp32, <= 1e-5), both round trips are bit-exact, a trained
expert bias is named when it is dropped, an in-training load reads only its rows' experts, and
configs with dense blocks are refused by the converter in one line (exit 2)."""

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
from helpers import ROOT, clean_env

from models.qwen3 import FLAVORS, HF, Qwen3
from titanlite.components.checkpoint import hf as hf_checkpoint
from titanlite.components.checkpoint import hf_training
from titanlite.components.checkpoint.record import model_config_record
from titanlite.components.checkpoint.storage import load_full_state_dict, save_full_state_dict

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

VOCAB, SEQ = 512, 48
ARGS = dataclasses.replace(FLAVORS["debugmodel_moe"], n_layers=2, vocab_size=VOCAB, max_seq_len=SEQ)


def _randomize(named_parameters) -> None:
    """std 0.05 so that attention and routing matter, norms away from 1."""
    with torch.no_grad():
        for name, p in named_parameters:
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.05 * torch.randn_like(p))


def _tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(0))


def _gap(model, hf_model) -> float:
    with torch.no_grad():
        return (model.eval()(_tokens()) - hf_model.eval()(_tokens()).logits).abs().max().item()


def _files(folder) -> dict[str, torch.Tensor]:
    return safetensors_torch.load_file(folder / "model.safetensors")


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """(a random Qwen3MoeForCausalLM, the folder its save_pretrained wrote)."""
    cfg = transformers.Qwen3MoeConfig(**HF.hf_config(ARGS, dtype=torch.float32))
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(cfg)
    _randomize(model.named_parameters())
    folder = tmp_path_factory.mktemp("hf") / "src"
    model.save_pretrained(folder)
    return model, folder


def test_a_transformers_folder_imports_with_its_logits_and_exports_back_bit_exactly(
    hf_folder, tmp_path
):
    hf_model, src = hf_folder
    names = _files(src)
    # transformers 5 writes the hub's format: one tensor per expert and projection
    assert "model.layers.1.mlp.experts.7.up_proj.weight" in names
    assert not any("gate_up_proj" in n for n in names)
    step = tmp_path / "dcp" / "step-0"
    hf_checkpoint.hf_to_dcp(src, step)
    sd = load_full_state_dict(step)["model"]
    args = HF.args_from_hf_config(json.loads((src / "config.json").read_text()))
    assert args == ARGS
    assert torch.equal(sd["layers.1.feed_forward.router.expert_bias"], torch.zeros(8))
    model = Qwen3(args)
    model.load_state_dict(sd)
    gap = _gap(model, hf_model)
    print(f"HF files -> titanlite: max |logits gap| {gap:.2e}")
    assert gap <= 1e-5
    back = tmp_path / "back"
    hf_checkpoint.dcp_to_hf(step, back)
    got = _files(back)
    assert sorted(got) == sorted(names) and all(torch.equal(got[k], names[k]) for k in names)


def test_titanlite_exports_a_folder_transformers_loads_with_its_logits(tmp_path):
    torch.manual_seed(1)
    model = Qwen3(ARGS)
    _randomize(model.named_parameters())
    step = tmp_path / "run" / "step-0"
    info = {"step": 0, "model_config": model_config_record("qwen3", None, ARGS, None)}
    save_full_state_dict({"model": model.state_dict()}, step, info)
    lines: list[str] = []
    hf_checkpoint.dcp_to_hf(step, tmp_path / "hf", report=lines.append)
    assert not [line for line in lines if "non-zero" in line]
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (cfg["model_type"], cfg["architectures"]) == ("qwen3_moe", ["Qwen3MoeForCausalLM"])
    assert (cfg["decoder_sparse_step"], cfg["mlp_only_layers"], cfg["num_experts"]) == (1, [], 8)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    assert type(loaded).__name__ == "Qwen3MoeForCausalLM"
    assert (loaded.config.num_experts_per_tok, loaded.config.norm_topk_prob) == (2, True)
    gap = _gap(model, loaded)
    print(f"titanlite -> HF files: max |logits gap| {gap:.2e}")
    assert gap <= 1e-5
    hf_checkpoint.hf_to_dcp(tmp_path / "hf", tmp_path / "back" / "step-0")
    back = load_full_state_dict(tmp_path / "back" / "step-0")["model"]
    sd = model.state_dict()
    assert back.keys() == sd.keys() and all(torch.equal(back[k], sd[k]) for k in sd)


def test_a_fused_folder_imports_as_the_per_expert_one(hf_folder, tmp_path):
    hf_model, src = hf_folder
    hf_model.save_pretrained(tmp_path / "fused", save_original_format=False)
    assert "model.layers.0.mlp.experts.gate_up_proj" in _files(tmp_path / "fused")
    hf_checkpoint.hf_to_dcp(src, tmp_path / "a" / "step-0")
    hf_checkpoint.hf_to_dcp(tmp_path / "fused", tmp_path / "b" / "step-0")
    a = load_full_state_dict(tmp_path / "a" / "step-0")["model"]
    b = load_full_state_dict(tmp_path / "b" / "step-0")["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_trained_expert_bias_is_named_when_the_export_drops_it(tmp_path):
    args = dataclasses.replace(ARGS, moe_load_balance="expert_bias")
    model = Qwen3(args)
    model.init_weights(seed=0)
    model.layers["1"].feed_forward.router.expert_bias[3] = 0.01
    step = tmp_path / "step-2"
    info = {"step": 2, "model_config": model_config_record("qwen3", None, args, None)}
    save_full_state_dict({"model": model.state_dict()}, step, info)
    lines: list[str] = []
    hf_checkpoint.dcp_to_hf(step, tmp_path / "hf", report=lines.append)
    notes = [line for line in lines if "non-zero" in line]
    assert len(notes) == 1 and "layers.1.feed_forward.router.expert_bias" in notes[0], lines
    assert "1 of the 2 tensors" in notes[0]
    assert not any("expert_bias" in n for n in _files(tmp_path / "hf"))


def test_an_in_training_load_reads_only_its_rows_experts(hf_folder, monkeypatch):
    hf_model, src = hf_folder
    folder = hf_checkpoint.HFFolder(src, ARGS)
    read = []
    real = hf_checkpoint.read_tensor
    by_start = {(e.file, e.start): n for n, e in folder.tensors.items()}
    monkeypatch.setattr(
        hf_checkpoint,
        "read_tensor",
        lambda f, e: read.append(by_start.get((e.file, e.start))) or real(f, e),
    )
    files: dict = {}
    # an FSDP 2 rank 1's shard of w13 (experts 4..7), as compute_local_shape_and_global_offset
    block = hf_training._local_slice(
        files, folder, "layers.0.feed_forward.experts.w13", (4, 256, 256), (4, 0, 0)
    )
    for f in files.values():
        f.close()
    whole = hf_model.state_dict()["model.layers.0.mlp.experts.gate_up_proj"]
    assert torch.equal(block, whole[4:])
    assert read == [
        f"model.layers.0.mlp.experts.{j}.{p}_proj.weight"
        for j in range(4, 8)
        for p in ("gate", "up")
    ]
    # one process: the whole model, the expert bias zero
    model = Qwen3(ARGS)
    model.init_weights(seed=0)
    model.layers["0"].feed_forward.router.expert_bias.fill_(1.0)
    hf_training.load_hf_weights(model, src, ARGS)
    assert not model.layers["0"].feed_forward.router.expert_bias.any()
    assert _gap(model, hf_model) <= 1e-5


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"decoder_sparse_step": 2}, "decoder_sparse_step = 2"),
        ({"mlp_only_layers": [1]}, "mlp_only_layers = [1]"),
    ],
)
def test_configs_with_dense_blocks_are_refused_by_the_converter(hf_folder, tmp_path, edit, message):
    _, src = hf_folder
    folder = tmp_path / "edited"
    folder.mkdir()
    cfg = json.loads((src / "config.json").read_text()) | edit
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "model.safetensors").symlink_to(src / "model.safetensors")
    proc = subprocess.run(
        [
            sys.executable,
            "scripts/convert_checkpoint.py",
            "hf-to-dcp",
            str(folder),
            str(tmp_path / "out"),
        ],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert message in lines[0] and "every block MoE" in lines[0]
    assert not (tmp_path / "out").exists()


def test_the_published_30b_a3b_config_reads_as_the_flavor():
    # Qwen/Qwen3-30B-A3B's config.json, as published (the fields titanlite reads)
    published = {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "attention_bias": False, "decoder_sparse_step": 1, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 6144,
        "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
        "moe_intermediate_size": 768, "norm_topk_prob": True, "num_attention_heads": 32,
        "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
        "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
        "sliding_window": None, "tie_word_embeddings": False, "use_sliding_window": False,
        "vocab_size": 151936,
    }  # fmt: skip
    want = dataclasses.replace(FLAVORS["30B-A3B"], vocab_size=151936)
    assert HF.args_from_hf_config(published) == want
