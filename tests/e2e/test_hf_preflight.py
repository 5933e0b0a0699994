"""Hugging Face start options that cannot work stop in preflight: one line, exit 2, before
torchrun (the preflight step of ./run_train.sh, run in process: helpers.preflight)."""

import shutil

import pytest
from helpers import expect_one_line, make_hf_llama, preflight_cases

pytest.importorskip("transformers")


def _reshaped_copy(src, dst, name: str):
    """`src` with one row too few in tensor `name`."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    tensors[name] = tensors[name][:-1].contiguous()
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_hf_initial_load_mistakes_stop_in_preflight(tmp_path):
    hf = make_hf_llama(tmp_path / "hf")
    (tmp_path / "not_hf").mkdir()
    reshaped = _reshaped_copy(hf, tmp_path / "reshaped", "model.layers.1.self_attn.v_proj.weight")

    def args(name: str, *extra: str) -> tuple:
        dump = [
            "--job.dump_folder",
            str(tmp_path / f"run_{name}"),
            "--checkpoint.enable_checkpoint",
        ]
        return ([*dump, "--checkpoint.initial_load_in_hf", *extra], {})

    got = preflight_cases(
        {
            "not_hf": args("not_hf", "--checkpoint.initial_load_path", str(tmp_path / "not_hf")),
            "other_shape": args(
                "other_shape", "--checkpoint.initial_load_path", str(hf), "--model.dim", "128"
            ),
            "no_path": args("no_path"),
            "reshaped": args("reshaped", "--checkpoint.initial_load_path", str(reshaped)),
        },
        shell=("no_path",),
    )
    expect_one_line(got["not_hf"], 2, "titanlite: error:", "has no config.json: not a Hugging Face")
    expect_one_line(got["other_shape"], 2, "holds another model", "dim 256 (config.json) vs 128")
    expect_one_line(got["no_path"], 2, "initial_load_in_hf needs initial_load_path")
    expect_one_line(
        got["reshaped"],
        2,
        "tensor model.layers.1.self_attn.v_proj.weight has shape (255, 256), the model",
        "needs (256, 256)",
    )
    for proc in got.values():
        assert "Traceback" not in proc.stderr and "ChildFailedError" not in proc.stderr
