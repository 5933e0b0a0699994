"""DeepSeek-V3 against transformers' `DeepseekV3ForCausalLM` (fp32, <= 1e-5 in logits): a folder
transformers wrote (per-expert tensors, a random expert bias) imports to its logits, with and
without the query latent and with YaRN, group-limited routing on throughout; titanlite's export
loads in AutoModelForCausalLM with its logits and its MTP module where the published checkpoint
keeps it, and imports back bit-exactly; the MTP module equals transformers' own `MtpModel` on
the same weights, and its loss is the cross-entropy of the labels shifted once more; without MTP
the model is the same model."""

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
from helpers import convert_checkpoint_main

from models.deepseek_v3 import FLAVORS, HF, DeepSeekV3
from models.deepseek_v3.mtp import IGNORE_INDEX, mtp_targets
from titanlite.components.checkpoint import hf as hf_checkpoint
from titanlite.components.checkpoint.record import model_config_record
from titanlite.components.checkpoint.storage import load_full_state_dict, save_full_state_dict

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

VOCAB, SEQ = 512, 48
# Two blocks: the dense one and an MoE one; 8 experts in 4 groups, 2 from the 2 best groups.
ARGS = dataclasses.replace(
    FLAVORS["debugmodel"], n_layers=2, vocab_size=VOCAB, max_seq_len=SEQ, mtp_depth=1
)
YARN = {
    "rope_factor": 4.0,
    "rope_original_max_seq_len": 12,
    "rope_mscale": 0.707,
    "rope_mscale_all_dim": 0.707,
}
TOL = 1e-5
ROUTED = ("feed_forward.experts.w13", "feed_forward.experts.w2")  # the routed experts' tensors


def _randomize(model: torch.nn.Module) -> None:
    """std 0.05 so that attention and routing matter, norms away from 1, a routing bias."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.05 * torch.randn_like(p))
        for name, b in model.named_buffers():
            if "e_score_correction_bias" in name or "expert_bias" in name:
                b.copy_(0.02 * torch.randn_like(b))


def _tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(0))


def _hf_model(args) -> torch.nn.Module:
    cfg = transformers.DeepseekV3Config(**HF.hf_config(args, dtype=torch.float32))
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(cfg).eval()
    _randomize(model)
    return model


def _gap(model, hf_model) -> float:
    with torch.no_grad():
        return (model.eval()(_tokens()) - hf_model.eval()(_tokens()).logits).abs().max().item()


def _imported(src, tmp_path) -> DeepSeekV3:
    step = tmp_path / "dcp" / "step-0"
    hf_checkpoint.hf_to_dcp(src, step)
    _, args, _ = hf_checkpoint.read_hf_config(src)
    model = DeepSeekV3(dataclasses.replace(args, max_seq_len=SEQ))
    model.load_state_dict(load_full_state_dict(step)["model"])
    return model


@pytest.mark.parametrize("variant", ["q_latent", "no_q_latent", "yarn"])
def test_a_transformers_folder_imports_with_its_logits(variant, tmp_path):
    over = {"no_q_latent": {"q_lora_rank": 0}, "yarn": YARN}.get(variant, {})
    args = dataclasses.replace(ARGS, **over)
    hf_model = _hf_model(args)
    src = tmp_path / "src"
    hf_model.save_pretrained(src)
    names = safetensors_torch.load_file(src / "model.safetensors")
    assert "model.layers.1.mlp.experts.7.up_proj.weight" in names
    # Its config counts an MTP module (num_nextn_predict_layers 1) that save_pretrained did not
    # write: the folder holds the main model, and imports as such.
    assert json.loads((src / "config.json").read_text())["num_nextn_predict_layers"] == 1
    assert not any(n.startswith("model.layers.2.") for n in names)
    model = _imported(src, tmp_path)
    assert model.args == dataclasses.replace(args, max_seq_len=SEQ, mtp_depth=0)
    bias = model.layers["1"].feed_forward.router.expert_bias
    assert torch.equal(bias, names["model.layers.1.mlp.gate.e_score_correction_bias"])
    gap = _gap(model, hf_model)
    print(f"{variant}: HF files -> titanlite: max |logits gap| {gap:.2e}")
    assert gap <= TOL


def _trained_model() -> DeepSeekV3:
    torch.manual_seed(1)
    model = DeepSeekV3(ARGS)
    _randomize(model)
    return model


def test_titanlite_exports_a_folder_transformers_loads_and_it_imports_back_bit_exactly(tmp_path):
    model = _trained_model()
    step = tmp_path / "run" / "step-0"
    info = {"step": 0, "model_config": model_config_record("deepseek_v3", None, ARGS, None)}
    save_full_state_dict({"model": model.state_dict()}, step, info)
    notes: list[str] = []
    hf_checkpoint.dcp_to_hf(step, tmp_path / "main", report=notes.append)
    # By default the main model only: MTP runs in training, not in what an export is for.
    assert any("multi-token-prediction modules" in n for n in notes), notes
    cfg = json.loads((tmp_path / "main" / "config.json").read_text())
    assert cfg["num_nextn_predict_layers"] == 0
    main = safetensors_torch.load_file(tmp_path / "main" / "model.safetensors")
    assert not any(k.startswith("model.layers.2.") for k in main)
    # Asked for (the script's flag): the MTP module too.
    assert convert_checkpoint_main()(["dcp-to-hf", str(step), str(tmp_path / "hf"), "--mtp"]) == 0
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (cfg["model_type"], cfg["num_nextn_predict_layers"], cfg["n_group"]) == (
        "deepseek_v3",
        1,
        4,
    )
    files = safetensors_torch.load_file(tmp_path / "hf" / "model.safetensors")
    # The MTP module as the published checkpoint keeps it: layer n_layers.
    assert {"model.layers.2.eh_proj.weight", "model.layers.2.shared_head.norm.weight"} <= set(files)
    assert "model.layers.2.mlp.experts.0.gate_proj.weight" in files
    assert all(torch.equal(main[k], files[k]) for k in main)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    assert type(loaded).__name__ == "DeepseekV3ForCausalLM"
    gap = _gap(model, loaded)
    print(f"titanlite -> HF files: max |logits gap| {gap:.2e}")
    assert gap <= TOL
    hf_checkpoint.hf_to_dcp(tmp_path / "hf", tmp_path / "back" / "step-0")
    back = load_full_state_dict(tmp_path / "back" / "step-0")["model"]
    sd = model.state_dict()
    assert back.keys() == sd.keys() and all(torch.equal(back[k], sd[k]) for k in sd)


def _hf_mtp(model: DeepSeekV3):
    """transformers' MtpModel on a DeepseekV3ForCausalLM, both with `model`'s weights."""
    from transformers.modeling_layers import MtpModel

    hf_main = _hf_model(ARGS)
    sd = model.state_dict()
    main = {HF.to_hf_name(k): v for k, v in sd.items() if not k.startswith("mtp.")}
    for key in [k for k in sd if k.endswith(ROUTED)]:
        main.pop(HF.to_hf_name(key), None)
    hf_main.load_state_dict(_fused_experts(sd, "layers.") | main, strict=True)
    mtp = MtpModel(hf_main, 1).eval()
    own = {
        "enorm.weight": "enorm.weight",
        "hnorm.weight": "hnorm.weight",
        "eh_proj.weight": "eh_proj.weight",
        "norm.weight": "post_norm.weight",
    }
    mtp_sd = {}
    for k, v in sd.items():
        if not k.startswith("mtp.2."):
            continue
        rest = k.removeprefix("mtp.2.")
        if rest in own:
            mtp_sd[f"layers.0.{own[rest]}"] = v
        elif not rest.endswith(ROUTED):
            hf = HF.to_hf_name(f"layers.2.{rest.removeprefix('block.')}")
            mtp_sd["layers.0.mtp_block." + hf.removeprefix("model.layers.2.")] = v
    for k, v in _fused_experts(sd, "mtp.2.block.").items():
        mtp_sd["layers.0.mtp_block." + k.removeprefix("model.layers.2.")] = v
    missing, unexpected = mtp.load_state_dict(mtp_sd, strict=False)
    assert not unexpected and all("embed_tokens" in m or "shared_head" in m for m in missing)
    return hf_main, mtp


def _fused_experts(sd: dict, prefix: str) -> dict:
    """transformers' in-memory expert tensors (gate_up_proj, down_proj) of titanlite's w13, w2."""
    out = {}
    for k, v in sd.items():
        if k.startswith(prefix) and k.endswith(ROUTED):
            layer = k.split(".")[1]
            name = "gate_up_proj" if k.endswith("w13") else "down_proj"
            out[f"model.layers.{layer}.mlp.experts.{name}"] = v
    return out


def test_the_mtp_module_equals_transformers_and_its_loss_is_the_shifted_cross_entropy():
    model = _trained_model().eval()
    hf_main, mtp = _hf_mtp(model)
    x = _tokens()
    labels = torch.cat([x[:, 1:], torch.randint(0, VOCAB, (2, 1))], dim=1)
    labels[0, 5] = IGNORE_INDEX
    with torch.no_grad():
        logits = model(x, mtp_targets=mtp_targets(labels, 1))
        [ours] = model.mtp_loss_sums
        out = hf_main(x, output_hidden_states=True)
        positions = torch.arange(SEQ)[None]
        shifted = torch.cat([x[:, 1:], torch.zeros_like(x[:, :1])], dim=1)
        h = mtp.forward_layer(0, out.hidden_states[-1], positions, None, input_ids=shifted)
        mtp_logits = mtp.shared_head(h)
    assert (logits - out.logits).abs().max() <= TOL
    # Depth 1 at position t predicts labels[t + 1] = x[t + 2]; the last position has none.
    target = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], IGNORE_INDEX)], dim=1)
    independent = F.cross_entropy(
        mtp_logits.flatten(0, 1), target.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    print(f"MTP loss sum: titanlite {ours.item():.6f}, transformers' MtpModel {independent:.6f}")
    assert torch.allclose(ours, independent, rtol=1e-6, atol=1e-4)


def test_without_mtp_it_is_the_same_model():
    with_mtp = _trained_model()
    without = DeepSeekV3(dataclasses.replace(ARGS, mtp_depth=0))
    sd = with_mtp.state_dict()
    assert set(without.state_dict()) == {k for k in sd if not k.startswith("mtp.")}
    without.load_state_dict({k: v for k, v in sd.items() if not k.startswith("mtp.")})
    x = _tokens()
    with torch.no_grad():
        assert torch.equal(with_mtp.eval()(x), without.eval()(x))
        labels = torch.roll(x, -1, dims=1)
        without(x, mtp_targets=without.mtp_targets(labels))
    assert without.mtp_targets(labels) == [] and without.mtp_loss_sums == []
