"""Float8 (torchao) on CPU: which layers convert, float8 numerics against high precision, and the
one-line errors for setups a machine cannot run."""

import dataclasses

import pytest
import torch
from helpers import preflight as preflight_run
from torch import nn

from models.llama import FLAVORS, Transformer
from parallelisms import LayoutError
from parallelisms.float8 import Float8Options, check_float8, convert_to_float8, plan_conversion
from titanlite.config.loader import ConfigError, load
from titanlite.preflight import checks as preflight
from titanlite.preflight import float8

pytest.importorskip("torchao")

BLOCK_LINEARS = [
    "attention.wq",
    "attention.wk",
    "attention.wv",
    "attention.wo",
    "feed_forward.w1",
    "feed_forward.w2",
    "feed_forward.w3",
]


def meta_llama(flavor: str, vocab: int) -> nn.Module:
    with torch.device("meta"):
        return Transformer(FLAVORS[flavor].with_overrides(vocab_size=vocab, max_seq_len=64))


@pytest.mark.parametrize("flavor,vocab", [("debugmodel", 512), ("8B", 128_256)])
def test_conversion_picks_every_block_linear_and_skips_the_output(flavor, vocab):
    model = meta_llama(flavor, vocab)
    plan = convert_to_float8(model, Float8Options())
    expected = [
        f"layers.{i}.{name}" for i in range(FLAVORS[flavor].n_layers) for name in BLOCK_LINEARS
    ]
    assert sorted(plan.converted) == sorted(expected)
    assert plan.skipped == {"output": "matches filter_fqns entry 'output'"}
    kinds = {name: type(m).__name__ for name, m in model.named_modules()}
    assert all(kinds[name] == "Float8Linear" for name in expected)
    assert kinds["output"] == "Linear"
    assert f"converting {len(expected)} of {len(expected) + 1} Linear layers" in plan.describe()


def test_an_moe_converts_attention_and_shared_linears_never_its_router():
    """Qwen3-30B-A3B's router (2048 -> 128, aligned) stays in high precision; its experts are
    3-D weights, not Linear layers, so they stay too."""
    from models.qwen3 import FLAVORS as QWEN3
    from models.qwen3 import Qwen3

    args = QWEN3["30B-A3B"].with_overrides(n_layers=2, max_seq_len=64)
    with torch.device("meta"):
        model = Qwen3(args)
    plan = convert_to_float8(model, Float8Options())
    routers = {f"layers.{i}.feed_forward.router.gate" for i in range(2)}
    assert {k for k, v in plan.skipped.items() if "MoE router" in v} == routers
    assert sorted(plan.converted) == sorted(
        f"layers.{i}.attention.{w}" for i in range(2) for w in ("wq", "wk", "wv", "wo")
    )


def test_conversion_skips_unaligned_shapes_and_filtered_names():
    model = nn.Sequential()
    model.add_module("aligned", nn.Linear(32, 64))
    model.add_module("odd_in", nn.Linear(24, 64))
    model.add_module("odd_out", nn.Linear(32, 40))
    model.add_module("frozen_head", nn.Linear(32, 64))
    plan = plan_conversion(model, Float8Options(filter_fqns=("head",)))
    assert plan.converted == ["aligned"]
    assert set(plan.skipped) == {"odd_in", "odd_out", "frozen_head"}
    assert "not a multiple of 16" in plan.skipped["odd_in"]
    assert "filter_fqns entry 'head'" in plan.skipped["frozen_head"]


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "rowwise_with_gw_hp"])
@pytest.mark.parametrize("emulate", [True, False])
def test_float8_linear_matches_high_precision_within_float8_rounding(recipe, emulate):
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(256, 512, bias=False))
    model = nn.Sequential(nn.Linear(256, 512, bias=False))
    model.load_state_dict(ref.state_dict())
    plan = convert_to_float8(model, Float8Options(recipe=recipe, emulate=emulate, filter_fqns=()))
    assert plan.converted == ["0"]
    x = torch.randn(128, 256)
    grad_out = torch.randn(128, 512)
    x_ref, x_f8 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ref, y_f8 = ref(x_ref), model(x_f8)
    y_ref.backward(grad_out)
    y_f8.backward(grad_out)
    # e4m3 keeps 3 mantissa bits: each rounded operand is off by at most 2^-4 relative; e5m2
    # (gradients) keeps 2 bits: 2^-3. Norm-wise errors of sums of products sit below those
    # worst cases; far below them (1e-3) would mean no float8 rounding happened at all.
    out_err = relative_error(y_f8, y_ref)
    assert 1e-3 < out_err < 2**-4, out_err
    grad_in_err = relative_error(x_f8.grad, x_ref.grad)
    assert 1e-3 < grad_in_err < 2**-3, grad_in_err
    grad_w_err = relative_error(model[0].weight.grad, ref[0].weight.grad)
    if recipe == "rowwise_with_gw_hp":  # the weight gradient stays in high precision
        assert grad_w_err < 1e-5, grad_w_err
    else:
        assert 1e-3 < grad_w_err < 2**-3, grad_w_err


def test_a_float8_model_state_dict_is_the_high_precision_one():
    ref = meta_llama("debugmodel", 512)
    converted = meta_llama("debugmodel", 512)
    convert_to_float8(converted, Float8Options())
    want = {k: (v.shape, v.dtype) for k, v in ref.state_dict().items()}
    got = {k: (v.shape, v.dtype) for k, v in converted.state_dict().items()}
    assert got == want


def test_old_gpu_without_emulation_is_refused_with_the_fix():
    opts = Float8Options()
    with pytest.raises(LayoutError, match=r"compute capability 8\.0.*--float8\.emulate true"):
        check_float8(opts, fsdp_enabled=True, device_type="cuda", cuda_capability=(8, 0))
    check_float8(
        dataclasses.replace(opts, emulate=True),
        fsdp_enabled=True,
        device_type="cuda",
        cuda_capability=(8, 0),
    )
    check_float8(opts, fsdp_enabled=True, device_type="cuda", cuda_capability=(9, 0))


FLOAT8 = ["--model.converters", "float8"]


def test_float8_all_gather_on_gloo_names_the_option_to_turn_off():
    job = load([*FLOAT8, "--float8.enable_fsdp_float8_all_gather", "true"])
    with pytest.raises(LayoutError) as e:
        preflight.check(job, world_size=2)
    message = str(e.value)
    assert "gloo" in message and "--float8.enable_fsdp_float8_all_gather false" in message
    assert "\n" not in message
    preflight.check(job, world_size=1)  # no FSDP, so no all-gather to refuse


def test_rowwise_with_float8_all_gather_is_refused():
    job = load(
        [
            *FLOAT8,
            "--float8.recipe_name",
            "rowwise",
            "--float8.enable_fsdp_float8_all_gather",
            "true",
        ]
    )
    with pytest.raises(
        LayoutError, match="rowwise.*cannot carry.*enable_fsdp_float8_all_gather false"
    ):
        preflight.check(job, world_size=2, device="cuda")


def test_precompute_without_float8_all_gather_is_a_config_error():
    with pytest.raises(ConfigError, match="precompute_float8_dynamic_scale_for_fsdp"):
        load([*FLOAT8, "--float8.precompute_float8_dynamic_scale_for_fsdp", "true"])


def test_unknown_converter_is_a_config_error():
    with pytest.raises(ConfigError, match="'fp4' is not one of 'float8'"):
        load(["--model.converters", "float8,fp4"])


def test_missing_torchao_says_which_extra_to_install(monkeypatch, capsys):
    monkeypatch.setattr(float8, "find_spec", lambda name: None)
    assert preflight.main(FLOAT8) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "titanlite: error: model.converters = ['float8'] needs torchao: "
        "pip install 'titanlite[float8]'"
    )
    assert preflight.main([]) == 0  # only float8 needs it


def test_float8_without_compile_is_one_warning_line_and_runs_on():
    """Eager float8 is usually slower than bf16: preflight (what ./run_train.sh runs before
    torchrun) says so in one line, exit 0; compile or emulate (numerics, not speed) silence it."""
    got = preflight_run(FLOAT8)
    assert got.returncode == 0
    assert [ln for ln in got.stderr.splitlines() if "float8" in ln] == [
        "titanlite: warning: model.converters = ['float8'] without training.compile: eager "
        "float8 casts are separate kernels and usually make the run slower than bfloat16; add "
        "--training.compile true"
    ], got.stderr
    for quiet in (["--training.compile", "true"], ["--float8.emulate", "true"], []):
        got = preflight_run([*(FLOAT8 if quiet else []), *quiet])
        assert got.returncode == 0 and "float8" not in got.stderr, got.stderr
