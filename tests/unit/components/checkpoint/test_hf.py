"""Hugging Face interop (titanlite.components.checkpoint.hf, models/llama/hf_mapping.py), proven against
transformers itself: exported checkpoints give LlamaForCausalLM the same logits as titanlite's
forward, HF -> titanlite -> HF is bit-exact, and user mistakes are one-line errors."""

import dataclasses
import json
import shutil

import pytest
import torch
from helpers import convert_checkpoint_main, make_hf_llama

from models.llama import FLAVORS, Transformer
from models.llama import hf_mapping as hf
from titanlite.components.checkpoint import hf as hf_checkpoint
from titanlite.components.checkpoint.folder import MANIFEST
from titanlite.components.checkpoint.record import (
    config_hash,
    model_config_record,
    model_differences,
)
from titanlite.components.checkpoint.storage import (
    load_full_state_dict,
    read_manifest,
    save_full_state_dict,
    verify,
)
from titanlite.data.tokenizer import BUILTIN_TOKENIZER, Tokenizer

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

VOCAB = Tokenizer(BUILTIN_TOKENIZER).vocab_size
VARIANTS = {"debugmodel": {}, "gqa": {"n_kv_heads": 4}}


convert = convert_checkpoint_main()


def random_titanlite(**overrides) -> Transformer:
    """The debug model with random weights of a scale where attention patterns matter, and
    norms away from 1."""
    args = FLAVORS["debugmodel"].with_overrides(vocab_size=VOCAB, max_seq_len=64, **overrides)
    torch.manual_seed(1)
    model = Transformer(args)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (1.0 if "tok_embeddings" in name else 0.05))
    return model.eval()


def save_titanlite(model: Transformer, path, tokenizer=BUILTIN_TOKENIZER, record=True):
    info = {"step": 0}
    if record:
        info["model_config"] = model_config_record("llama3", "debugmodel", model.args, tokenizer)
    save_full_state_dict({"model": model.state_dict()}, path, info)
    return path


def hf_tensors(folder) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(safetensors_torch.load_file(f))
    return out


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """variant -> (model, its DCP checkpoint, the exported HF folder, progress lines)."""
    out = {}
    for variant, overrides in VARIANTS.items():
        root = tmp_path_factory.mktemp(variant)
        model = random_titanlite(**overrides)
        step = save_titanlite(model, root / "step-0")
        lines = []
        hf_checkpoint.dcp_to_hf(step, root / "hf", report=lines.append)
        out[variant] = model, step, root / "hf", lines
    return out


@pytest.fixture(scope="module")
def exported(exports):
    return exports["gqa"]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_export_gives_transformers_the_same_logits(exports, variant):
    model, _, folder, lines = exports[variant]
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert type(hf_model).__name__ == "LlamaForCausalLM"
    assert hf_model.config.num_key_value_heads == model.args.kv_heads
    tokens = torch.randint(0, VOCAB, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = model(tokens), hf_model(tokens).logits
    diff = (ours - theirs).abs().max().item()
    print(f"max |logits difference| {diff:.2e} (logits up to {ours.abs().max().item():.2f})")
    assert diff <= 1e-5
    assert lines[-1].startswith(
        f"[{len(model.state_dict())}/{len(model.state_dict())}] lm_head.weight"
    )


def test_export_folder_contents_and_tokenizer(exported):
    _, _, folder, _ = exported
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    cfg = json.loads((folder / "config.json").read_text())
    assert (cfg["rope_scaling"]["rope_type"], cfg["rope_theta"], cfg["torch_dtype"]) == (
        "llama3",
        500000.0,
        "float32",
    )
    ours = Tokenizer(BUILTIN_TOKENIZER)
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (ours.bos_id, ours.eos_id)
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    text = "def train(model):\n    return model  # héllo"
    assert theirs.encode(text, add_special_tokens=False) == ours.encode_documents([text])[0][1:-1]
    assert (theirs.bos_token_id, theirs.eos_token_id) == (ours.bos_id, ours.eos_id)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_hf_to_titanlite_to_hf_round_trip_is_bit_exact(tmp_path, dtype):
    # Written by transformers itself (config in its own format), sharded with an index.
    src = make_hf_llama(tmp_path / "src", n_kv_heads=4, dtype=dtype, max_shard_size="2MB")
    assert (src / "model.safetensors.index.json").is_file()
    step = tmp_path / "dcp" / "step-0"
    hf_checkpoint.hf_to_dcp(src, step)
    assert verify(step) == []
    assert read_manifest(step)["model_config"]["args"]["n_kv_heads"] == 4
    back = tmp_path / "back"
    hf_checkpoint.dcp_to_hf(step, back, max_shard_size=4 * 10**6)
    want, got = hf_tensors(src), hf_tensors(back)
    assert sorted(got) == sorted(want)
    for name, t in want.items():
        assert t.dtype == getattr(torch, dtype) and torch.equal(got[name], t), name
    assert len(list(back.glob("model-*-of-*.safetensors"))) > 1
    a, b = (json.loads((f / "config.json").read_text()) for f in (src, back))
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "rms_norm_eps",
        "vocab_size",
        "max_position_embeddings",
        "rope_parameters",
        "tie_word_embeddings",
    ):
        assert a[key] == b[key], key


def test_imported_weights_give_titanlite_the_logits_of_transformers(tmp_path):
    src = make_hf_llama(tmp_path / "src", n_kv_heads=4)
    step = tmp_path / "step-0"
    hf_checkpoint.hf_to_dcp(src, step)
    args = FLAVORS["debugmodel"].with_overrides(vocab_size=VOCAB, max_seq_len=64, n_kv_heads=4)
    assert args.to_dict() | {"max_seq_len": 131072} == read_manifest(step)["model_config"]["args"]
    model = Transformer(args).eval()
    model.load_state_dict(load_full_state_dict(step)["model"])
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    tokens = torch.randint(0, VOCAB, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (model(tokens) - hf_model(tokens).logits).abs().max().item() <= 1e-5


def test_dtype_option_and_progress_through_the_cli(exported, tmp_path, capsys):
    model, step, _, _ = exported
    assert convert(["dcp-to-hf", str(step), str(tmp_path / "bf16"), "--dtype", "bfloat16"]) == 0
    err = capsys.readouterr().err
    n = len(model.state_dict())
    assert f"[{n}/{n}] lm_head.weight" in err and "MiB" in err
    got = hf_tensors(tmp_path / "bf16")
    assert torch.equal(got["model.norm.weight"], model.norm.weight.detach().to(torch.bfloat16))
    assert all(t.dtype == torch.bfloat16 for t in got.values())
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_model_comes_from_the_runs_config_toml_when_the_manifest_lacks_it(tmp_path):
    from titanlite.config import loader as config_lib

    model = random_titanlite(n_kv_heads=4)
    dump = tmp_path / "run"
    step = save_titanlite(model, dump / "checkpoint" / "step-0", record=False)
    err = _error(["dcp-to-hf", str(step), str(tmp_path / "out")])
    assert "cannot tell the model's shape" in err and "--config" in err
    text = config_lib.to_toml(
        config_lib.load(["--config", "debug_model.toml", "--model.n_kv_heads", "4"])
    )
    (dump / "config.toml").write_text(text)
    manifest = json.loads((step / MANIFEST).read_text())
    manifest["config_hash"] = config_hash(text)
    (step / MANIFEST).write_text(json.dumps(manifest))
    hf_checkpoint.dcp_to_hf(step, tmp_path / "out")
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["num_key_value_heads"] == 4 and (tmp_path / "out" / "tokenizer.json").is_file()
    # A config that does not describe the checkpoint is caught by the shapes.
    err = _error(["dcp-to-hf", str(step), str(tmp_path / "other"), "--config", "debug_model.toml"])
    assert (
        "layers.0.attention.wk.weight has shape (64, 256), the model" in err
        and "needs (256, 256)" in err
    )


def _error(argv) -> str:
    import io
    from contextlib import redirect_stderr

    buf = io.StringIO()
    with redirect_stderr(buf):
        assert convert(argv) == 2
    lines = [
        ln for ln in buf.getvalue().splitlines() if ln.startswith("convert_checkpoint: error:")
    ]
    assert len(lines) == 1, buf.getvalue()
    return lines[0]


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    return make_hf_llama(tmp_path_factory.mktemp("hf") / "src")


def _edited_copy(src, dst, config=None, drop=None, reshape=None, retype=None):
    """`retype`: {tensor: the dtype to store it in}."""
    shutil.copytree(src, dst)
    if config:
        cfg = json.loads((dst / "config.json").read_text())
        cfg.update(config)
        (dst / "config.json").write_text(json.dumps(cfg))
    if drop or reshape or retype:
        tensors = safetensors_torch.load_file(dst / "model.safetensors")
        tensors.pop(drop, None)
        if reshape:
            tensors[reshape] = tensors[reshape][:-1].contiguous()
        for name, dtype in (retype or {}).items():
            tensors[name] = tensors[name].to(dtype)
        safetensors_torch.save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize(
    "edit,message",
    [
        (
            {"config": {"model_type": "mistral"}},
            "config.json: model_type = 'mistral': titanlite's Llama needs 'llama'",
        ),
        ({"config": {"hidden_act": "gelu"}}, "config.json: hidden_act = 'gelu'"),
        ({"config": {"attention_bias": True}}, "config.json: attention_bias = True"),
        (
            {
                "config": {
                    "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}
                }
            },
            "config.json: rope_parameters.rope_type = 'yarn'",
        ),
        ({"config": {"head_dim": 32}}, "config.json: head_dim = 32"),
        (
            {"drop": "model.layers.3.mlp.up_proj.weight"},
            "has no tensor model.layers.3.mlp.up_proj.weight",
        ),
        (
            {"reshape": "model.layers.2.self_attn.k_proj.weight"},
            "tensor model.layers.2.self_attn.k_proj.weight has shape (255, 256), the model",
        ),
        (
            {"config": {"num_hidden_layers": 5}},
            "has tensor model.layers.5.input_layernorm.weight, which a Llama",
        ),
        (
            {"retype": {"model.layers.1.mlp.down_proj.weight": torch.int8}},
            "tensor model.layers.1.mlp.down_proj.weight has dtype int8, the model needs floating "
            "weights (float32)",
        ),
    ],
)
def test_hf_folder_mistakes_are_one_line_errors(hf_folder, tmp_path, edit, message):
    src = _edited_copy(hf_folder, tmp_path / "src", **edit)
    err = _error(["hf-to-dcp", str(src), str(tmp_path / "out" / "step-0")])
    assert message in err, err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_float16_tensors_of_a_float32_folder_are_cast_with_one_note(hf_folder, tmp_path, capsys):
    norms = ["model.norm.weight", "model.layers.0.input_layernorm.weight"]
    src = _edited_copy(hf_folder, tmp_path / "src", retype=dict.fromkeys(norms, torch.float16))
    assert convert(["hf-to-dcp", str(src), str(tmp_path / "out")]) == 0
    notes = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("note:")]
    assert len(notes) == 1 and f"2 of its 57 tensors (e.g. {norms[1]}) are float16" in notes[0]
    assert "cast to float32" in notes[0], notes
    got = load_full_state_dict(tmp_path / "out")["model"]
    assert all(t.dtype == torch.float32 for t in got.values())
    want = hf_tensors(src)["model.norm.weight"].float()
    assert torch.equal(got["norm.weight"], want)


def test_pickle_weights_missing_files_and_existing_destinations_are_refused(
    hf_folder, exported, tmp_path
):
    src = tmp_path / "pickled"
    src.mkdir()
    shutil.copy(hf_folder / "config.json", src)
    (src / "pytorch_model.bin").write_bytes(b"not read")
    assert "safetensors only, never pickle" in _error(["hf-to-dcp", str(src), str(tmp_path / "x")])
    assert "has no config.json" in _error(["hf-to-dcp", str(tmp_path), str(tmp_path / "x")])
    truncated = _edited_copy(hf_folder, tmp_path / "truncated")
    with (truncated / "model.safetensors").open("r+b") as f:
        f.truncate(f.seek(0, 2) - 10)
    assert "not a valid safetensors file" in _error(
        ["hf-to-dcp", str(truncated), str(tmp_path / "x")]
    )
    _, step, out, _ = exported
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    assert f"{out} already exists; refusing to overwrite it" in _error(
        ["dcp-to-hf", str(step), str(out)]
    )
    assert f"{step} already exists" in _error(["hf-to-dcp", str(hf_folder), str(step)])
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime
    assert "does not exist" in _error(
        ["dcp-to-hf", str(step), str(tmp_path / "y"), "--tokenizer", str(tmp_path / "nope")]
    )
    assert not (tmp_path / "y").exists() and not (tmp_path / ".y.partial").exists()


def test_published_llama31_config_maps_to_the_8b_flavor():
    published = {  # Meta-Llama-3.1-8B/config.json (transformers 4.x format)
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 131072,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.43.0.dev0",
        "use_cache": True,
        "vocab_size": 128256,
    }
    args = hf.args_from_hf_config(published)
    assert args == FLAVORS["8B"].with_overrides(vocab_size=128256, rope_theta=500000.0)
    back = hf.hf_config(args, dtype=torch.bfloat16, bos_token_id=128000, eos_token_id=128001)
    assert {k: back[k] for k in published if k != "transformers_version"} == {
        k: v for k, v in published.items() if k != "transformers_version"
    }
    # An FFN width no flavor uses still round-trips exactly.
    odd = hf.args_from_hf_config({**published, "intermediate_size": 5000})
    assert odd.ffn_hidden_dim == 5000


def test_qk_permutation_is_a_per_head_interleave_and_inverts():
    w = torch.arange(2 * 8 * 3).reshape(16, 3)  # 2 heads of head_dim 8, 3 input features
    p = hf.permute_to_hf(w, 2)
    assert p[:, 0].tolist() == [0, 6, 12, 18, 3, 9, 15, 21, 24, 30, 36, 42, 27, 33, 39, 45]
    assert torch.equal(hf.permute_from_hf(p, 2), w)
    assert (
        hf.to_hf_name("layers.11.feed_forward.w2.weight") == "model.layers.11.mlp.down_proj.weight"
    )
    assert (
        hf.from_hf_name("model.layers.11.self_attn.k_proj.weight")
        == "layers.11.attention.wk.weight"
    )


def test_model_differences_name_the_fields_that_change_the_function_but_not_the_shapes():
    debug = FLAVORS["debugmodel"].with_overrides(vocab_size=VOCAB, max_seq_len=64)
    llama2_rope = dataclasses.replace(debug, rope_theta=10000.0, rope_scaling=None)
    imported = hf.args_from_hf_config(hf.hf_config(llama2_rope, dtype=torch.float32))
    assert model_differences(imported.to_dict(), debug.to_dict()) == [
        "rope_theta = 10000.0 (checkpoint) vs 500000 (configured)",
        "rope_scaling = None (checkpoint) vs [8.0, 1.0, 4.0, 8192] (configured)",
    ]
    assert model_differences({**debug.to_dict(), "max_seq_len": 131072}, debug.to_dict()) == []
