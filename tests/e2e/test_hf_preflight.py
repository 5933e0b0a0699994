"""Hugging Face start options that cannot work stop in preflight: one line, exit 2, before
torchrun (the preflight step of ./run_train.sh, run in process: helpers.preflight)."""

import pytest
from helpers import expect_one_line, make_hf_llama, preflight_cases

pytest.importorskip("transformers")


def test_hf_initial_load_mistakes_stop_in_preflight(tmp_path):
    hf = make_hf_llama(tmp_path / "hf")
    (tmp_path / "not_hf").mkdir()

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
        },
        shell=("no_path",),
    )
    expect_one_line(got["not_hf"], 2, "titanlite: error:", "has no config.json: not a Hugging Face")
    expect_one_line(got["other_shape"], 2, "holds another model", "dim 256 (config.json) vs 128")
    expect_one_line(got["no_path"], 2, "initial_load_in_hf needs initial_load_path")
    for proc in got.values():
        assert "Traceback" not in proc.stderr and "ChildFailedError" not in proc.stderr
