"""TorchTitan's own Llama 3 TOMLs (tests/fixtures/torchtitan/, one per release v0.1.0, v0.2.0,
v0.2.1, v0.2.2 and file) load in titanlite: renamed keys with a one-line note naming titanlite's
spelling, features titanlite lacks accepted at their defaults only. The 8B/70B/405B ones plan
with the dry run; a debug one trains with only its paths overridden."""

from pathlib import Path

import pytest
from helpers import ROOT, check, read_jsonl, run_script

from titanlite.config import loader as config_lib
from titanlite.config.loader import ConfigError, load

FIXTURES = ROOT / "tests" / "fixtures" / "torchtitan"
RELEASES = ("v0_1_0", "v0_2_0", "v0_2_1", "v0_2_2")
NAMES = ("debug_model", "llama3_8b", "llama3_70b", "llama3_405b")
TOKENIZER = ROOT / "titanlite" / "assets" / "tokenizer"
CORPUS = ROOT / "titanlite" / "assets" / "corpus"


def fixture(release: str, name: str) -> Path:
    return FIXTURES / f"{release}_{name}.toml"


def test_every_release_toml_loads_with_notes_for_renamed_keys(capsys):
    for release in RELEASES:
        for name in NAMES:
            cfg = load(["--config", str(fixture(release, name))])
            notes = capsys.readouterr().err
            assert cfg.model.name == "llama3"
            if release != "v0_1_0":  # v0.2 renamed these; titanlite names its spelling
                assert (
                    "[model] hf_assets_path is TorchTitan's name; titanlite spells it "
                    "[model] tokenizer_path" in notes
                ), notes
                assert "[checkpoint] enable is TorchTitan's name" in notes
                assert (
                    "[compile] enable is TorchTitan's name; titanlite spells it [training] "
                    "compile" in notes
                )
                assert (
                    "[quantize.linear.float8] is TorchTitan's name; titanlite spells it "
                    "[float8]" in notes
                )
                assert "[validation] enable is TorchTitan's name" in notes
                assert all(ln.startswith("titanlite: note: ") for ln in notes.splitlines())
    big = load(["--config", str(fixture("v0_2_2", "llama3_405b"))])
    assert big.training.compile and big.float8.enable_fsdp_float8_all_gather
    assert big.model.converters == ["float8"] and big.parallelism.tensor_parallel_degree == 8


def test_older_spellings_and_refusals(tmp_path, capsys):
    older = tmp_path / "older.toml"
    older.write_text(
        "[training]\nbatch_size = 3\n[float8]\nfilter_fqns = 'output'\n"
        "[lr_scheduler]\nmin_lr_factor = 0.1\n"
    )
    cfg = load(["--config", str(older)])
    assert cfg.training.local_batch_size == 3 and cfg.float8.filter_fqns == ["output"]
    assert cfg.lr_scheduler.lr_min == 0.1
    notes = capsys.readouterr().err
    assert (
        "[training] batch_size is TorchTitan's name; titanlite spells it [training] "
        "local_batch_size" in notes
    )
    # Features titanlite lacks: accepted at the default, refused when set.
    for body, words in (
        ("[compile]\nenable = true\ncomponents = ['model']\n", "titanlite supports only"),
        ("[fault_tolerance]\nenable = true\n", "not supported by titanlite yet"),
        ("[parallelism]\nenable_compiled_autograd = true\n", "not supported by titanlite yet"),
        ("[quantize.linear.mx]\nrecipe_name = 'mxfp8'\n", "unknown section"),
    ):
        bad = tmp_path / "bad.toml"
        bad.write_text(body)
        with pytest.raises(ConfigError, match=words):
            load(["--config", str(bad)])


@pytest.mark.slow
def test_release_tomls_for_8b_70b_405b_plan_with_the_dry_run(capsys):
    from titanlite.planning import dry_run

    world = {"llama3_8b": 8, "llama3_70b": 64, "llama3_405b": 128}
    planned = {}
    for release in RELEASES:
        for name, n in world.items():
            path = fixture(release, name)
            cfg = load(["--config", str(path)])
            cfg.job.config_file = None
            key = config_lib.to_toml(cfg)  # identical files across releases plan identically
            if key in planned:
                continue
            capsys.readouterr()
            assert dry_run.main(["--config", str(path), "--dry-run.world_size", str(n)]) == 0
            out = capsys.readouterr()
            flavor = name.split("_")[1].upper()
            assert f"dry run: llama3 {flavor}" in out.out + out.err, out
            planned[key] = path.name
    assert len(planned) >= 6, planned  # v0.1.0 and v0.2.x differ (float8, compile, names)


@pytest.mark.slow
def test_debug_release_toml_trains_with_only_paths_overridden(tmp_path):
    # v0.2.2's debug_model: its tokenizer folder and dataset name are TorchTitan's files; the
    # rest (seq_len 2048, batch 8, bf16, warmup 2, ...) is the release's own. One step instead of
    # 10: a step of 8 x 2048 tokens under the CPU's emulated bf16 took ~45 s in the suite.
    proc = check(
        run_script(
            "run_train.sh",
            [
                "--config",
                str(fixture("v0_2_2", "debug_model")),
                "--model.hf_assets_path",
                str(TOKENIZER),
                "--training.dataset_path",
                str(CORPUS),
                "--job.dump_folder",
                str(tmp_path),
                "--training.steps",
                "1",
            ],
            timeout=600,
        )
    )
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1] and records[0]["loss"] > 0
    assert "titanlite spells it [model] tokenizer_path" in proc.stderr


def test_a_dropped_float8_option_loads_with_a_note(tmp_path, capsys):
    """force_recompute_fp8_weight_in_bwd is a no-op in torchao 0.18: titanlite dropped it, and
    TorchTitan's TOMLs (either table name) and command lines that set it still load."""
    for table in ("[quantize.linear.float8]", "[float8]"):
        toml = tmp_path / "f8.toml"
        toml.write_text(f"{table}\nforce_recompute_fp8_weight_in_bwd = true\n")
        load(["--config", str(toml)])
        assert (
            f"titanlite: note: {toml}: [float8] force_recompute_fp8_weight_in_bwd = True is "
            "ignored: torchao 0.18 no longer reads it" in capsys.readouterr().err
        )
    load(["--float8.force_recompute_fp8_weight_in_bwd", "true"])
    assert "force_recompute_fp8_weight_in_bwd = 'true' is ignored" in capsys.readouterr().err
