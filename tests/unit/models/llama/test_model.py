import math

import pytest
import torch

from models.llama import FLAVORS, LlamaArgs, Transformer, num_params, training_flops_per_token
from models.llama.model import Attention, apply_rope, rope_frequencies

PUBLISHED = {"8B": 8_030_261_248, "70B": 70_553_706_496, "405B": 405_853_388_800}


@pytest.mark.parametrize("flavor", ["debugmodel", "8B", "70B", "405B"])
def test_parameter_counts_on_meta(flavor):
    vocab = 2048 if flavor == "debugmodel" else 128_256
    args = FLAVORS[flavor].with_overrides(vocab_size=vocab, max_seq_len=16)
    with torch.device("meta"):
        model = Transformer(args)
    counted = sum(p.numel() for p in model.parameters())
    assert counted == num_params(args)
    if flavor in PUBLISHED:
        assert counted == PUBLISHED[flavor]
    assert all(p.device.type == "meta" for p in model.parameters())


def test_debugmodel_matches_torchtitan_shape():
    a = FLAVORS["debugmodel"]
    assert (a.dim, a.n_layers, a.n_heads, a.kv_heads, a.multiple_of, a.rope_theta) == (
        256,
        6,
        16,
        16,
        256,
        500000,
    )


def test_8b_shapes():
    a = FLAVORS["8B"]
    assert (a.head_dim, a.kv_heads, a.ffn_hidden_dim) == (128, 8, 14336)


def test_flops_per_token_formula():
    a = FLAVORS["8B"].with_overrides(vocab_size=128_256)
    non_embedding = num_params(a) - 128_256 * 4096
    assert training_flops_per_token(a, 8192) == 6 * non_embedding + 12 * 32 * 32 * 128 * 8192


def _reference_rope(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x[2i], x[2i+1]) at position t by angle t * theta_i, with real math."""
    seq = x.shape[1]
    t = torch.arange(seq, dtype=torch.float64)[:, None]
    ang = t * theta[None, :].double()  # (seq, d/2)
    cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
    x0, x1 = x[..., 0::2].double(), x[..., 1::2].double()
    out = torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)
    return out.float()


def _reference_llama31_theta(args: LlamaArgs) -> torch.Tensor:
    """Meta's published apply_scaling, element by element."""
    factor, low, high, ctx = args.rope_scaling
    out = []
    for i in range(0, args.head_dim, 2):
        freq = 1.0 / (args.rope_theta ** (i / args.head_dim))
        wavelen = 2 * math.pi / freq
        if wavelen < ctx / high:
            out.append(freq)
        elif wavelen > ctx / low:
            out.append(freq / factor)
        else:
            smooth = (ctx / wavelen - low) / (high - low)
            out.append((1 - smooth) * freq / factor + smooth * freq)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("scaling", [None, (8.0, 1.0, 4.0, 8192)])
def test_rope_matches_reference(scaling):
    args = LlamaArgs(dim=512, n_heads=4, rope_theta=500000, rope_scaling=scaling, vocab_size=8)
    seq = 64
    theta = (
        _reference_llama31_theta(args)
        if scaling
        else 1.0 / args.rope_theta ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128)
    )
    freqs = rope_frequencies(args, seq)
    torch.manual_seed(0)
    q, k = torch.randn(2, seq, 4, 128), torch.randn(2, seq, 2, 128)
    rq, rk = apply_rope(q, k, freqs)
    torch.testing.assert_close(rq, _reference_rope(q, theta), atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(rk, _reference_rope(k, theta), atol=2e-4, rtol=1e-4)


def test_llama31_scaling_changes_only_long_wavelengths():
    scaled = rope_frequencies(LlamaArgs(dim=512, n_heads=4, rope_theta=500000), 2)[1].angle()
    plain = rope_frequencies(
        LlamaArgs(dim=512, n_heads=4, rope_theta=500000, rope_scaling=None), 2
    )[1].angle()
    assert torch.allclose(scaled[:10], plain[:10])  # high frequencies untouched
    assert torch.allclose(scaled[-1], plain[-1] / 8)  # the lowest slowed by the factor


@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_attention_matches_plain_reference(n_kv_heads):
    torch.manual_seed(0)
    args = LlamaArgs(dim=64, n_heads=8, n_kv_heads=n_kv_heads, vocab_size=8, rope_scaling=None)
    attn = Attention(args)
    x = torch.randn(2, 10, 64)
    freqs = rope_frequencies(args, 10)
    out = attn(x, freqs)

    hd = args.head_dim
    q = attn.wq(x).view(2, 10, 8, hd)
    k = attn.wk(x).view(2, 10, args.kv_heads, hd)
    v = attn.wv(x).view(2, 10, args.kv_heads, hd)
    q, k = apply_rope(q, k, freqs)
    rep = 8 // args.kv_heads
    k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
    mask = torch.ones(10, 10, dtype=torch.bool).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    ref = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(2, 10, 64)
    torch.testing.assert_close(out, attn.wo(ref), atol=1e-5, rtol=1e-5)


def _tiny(seed: int = 0, **over) -> Transformer:
    args = FLAVORS["debugmodel"].with_overrides(vocab_size=97, n_layers=2, max_seq_len=32, **over)
    model = Transformer(args)
    model.init_weights(seed)
    return model


def test_forward_is_causal_and_shaped():
    model = _tiny()
    tokens = torch.randint(0, 97, (2, 16))
    logits = model(tokens)
    assert logits.shape == (2, 16, 97)
    changed = tokens.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 97
    torch.testing.assert_close(model(changed)[:, :10], logits[:, :10])
    assert not torch.allclose(model(changed)[:, 10:], logits[:, 10:])


def test_init_is_deterministic_in_seed_and_device_independent():
    a, b, c = _tiny(0), _tiny(0), _tiny(1)
    for (n, p), q, r in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(p, q), n
        if p.dim() == 2:
            assert not torch.equal(p, r), n
    # Built on meta then materialized gives the same weights as built on CPU.
    with torch.device("meta"):
        m = Transformer(a.args)
    m.to_empty(device="cpu")
    m.init_weights(0, buffer_device=torch.device("cpu"))
    for p, q in zip(a.parameters(), m.parameters()):
        assert torch.equal(p, q)
    torch.testing.assert_close(m.freqs_cis, a.freqs_cis)


def test_init_statistics():
    model = _tiny()
    std = model.layers["0"].attention.wq.weight.std().item()
    assert abs(std - 0.02) < 0.002
    out_std = model.layers["1"].attention.wo.weight.std().item()
    assert abs(out_std - 0.02 / 2) < 0.002  # depth-scaled: 0.02 / sqrt(2 * (layer + 1))
    assert abs(model.tok_embeddings.weight.std().item() - 1.0) < 0.05
    assert torch.equal(model.norm.weight, torch.ones(256))


def test_family_registry_is_the_config_choices(monkeypatch):
    import parallelisms.llama
    import parallelisms.pipeline
    from titanlite.config.schema import Model
    from titanlite.families import FAMILIES

    family = FAMILIES["llama3"]
    assert family.model.model_cls is Transformer
    # The record imports its parallelize and split functions when first called.
    monkeypatch.setattr(parallelisms.llama, "parallelize_llama", lambda *a: ("parallelize", a))
    monkeypatch.setattr(parallelisms.pipeline, "stage_models", lambda *a: ("split", a))
    assert family.parallelize(1, 2, 3, 4) == ("parallelize", (1, 2, 3, 4))
    assert family.split_stages(1, 2, 3) == ("split", (1, 2, 3))
    # model.name's choices are written out in the schema (importing the families would import
    # torch into every config load): they must be exactly the registered families.
    assert set(Model.__dataclass_fields__["name"].metadata["choices"]) == set(FAMILIES)


@pytest.mark.parametrize("ac", ["none", "full", "selective_op"])
def test_activation_estimate_within_25_percent_of_measured_peak(ac):
    import importlib.util

    from helpers import ROOT

    spec = importlib.util.spec_from_file_location(
        "calibrate", ROOT / "scripts" / "calibrate_memory.py"
    )
    calibrate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(calibrate)
    _, measured, predicted = calibrate.measure("debug", ac)
    assert 0.75 <= predicted / measured <= 1.25, (ac, measured, predicted)
