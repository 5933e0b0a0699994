"""The checkpoint's model tensors against the configured model's (issue 46, item 1): any
hyper-parameter difference that changes which tensors exist or their shapes is refused, naming
the field; a truncated load only on request. The checkpoint's side is a meta model's shapes, as
its `.metadata` records them (tests/e2e/test_failures.py goes through a real one)."""

import pytest

from titanlite.config.loader import load
from titanlite.families import model_args
from titanlite.preflight.checkpoint import _tensor_shapes, model_tensor_problem

MOE = ["--config", "qwen3_moe_debug.toml"]


def saved_by(*argv: str):
    """What a checkpoint of the model `argv` configures holds: its tensors' shapes and its
    manifest's record of the args."""
    job = load(list(argv))
    args = model_args(job, vocab_size=2000)
    return _tensor_shapes(job, args), args.to_dict()


def problem(saved, *argv: str) -> str | None:
    job = load(list(argv))
    return model_tensor_problem(*saved, model_args(job, vocab_size=2000), job)


@pytest.mark.parametrize(
    "saved_argv, argv, named",
    [
        # Fewer blocks than saved: the case that trained a smaller model with exit 0.
        ((*MOE, "--model.n_layers", "2"), (*MOE, "--model.n_layers", "1"), "n_layers = 2"),
        # An MoE checkpoint into the dense model of the same shapes otherwise.
        (MOE, (*MOE, "--model.flavor", "debugmodel"), "moe_experts = 8 (checkpoint) vs 0"),
        (("--model.n_layers", "6"), ("--model.n_layers", "3"), "n_layers = 6"),
        (("--model.dim", "256"), ("--model.dim", "128"), "dim = 256 (checkpoint) vs 128"),
        (("--model.n_layers", "3"), ("--model.n_layers", "6"), "n_layers = 3"),
    ],
)
def test_a_shape_changing_difference_is_refused_naming_the_field(saved_argv, argv, named):
    got = problem(saved_by(*saved_argv), *argv)
    assert got is not None and named in got and "changes the model's tensors" in got, got


def test_a_partial_load_is_admitted_only_for_a_subset_and_only_on_request():
    saved = saved_by(*MOE, "--model.n_layers", "2")
    assert problem(saved, *MOE, "--model.n_layers", "2") is None
    assert "allow_partial_model_load" in (problem(saved, *MOE, "--model.n_layers", "1") or "")
    partial = "--checkpoint.allow_partial_model_load"
    assert problem(saved, *MOE, "--model.n_layers", "1", partial) is None
    # Tensors the checkpoint lacks or holds at other shapes are refused even so.
    wider = problem(saved, *MOE, "--model.n_layers", "1", "--model.dim", "128", partial)
    assert wider is not None and "dim = 256 (checkpoint) vs 128" in wider


def test_function_only_differences_and_unrecorded_args_pass_or_fall_back_to_the_keys():
    saved = saved_by("--model.n_layers", "6")
    assert problem(saved, "--model.n_layers", "6", "--model.rope_theta", "10000") is None
    shapes, _ = saved
    # An older manifest records no args: the tensors still decide, naming one.
    got = problem((shapes, {}), "--model.n_layers", "3")
    assert got is not None and "lacks (e.g. 'layers.3." in got, got
