"""Data mixtures from the command line: the bundled corpus split into prepared sources (code,
two halves of the prose), trained through ./run_train.sh with weights and phases; the plan line,
the per-source token counts in metrics.jsonl, achieved shares against the targets, an exact
resume (the same layout) and one on another data-parallel degree, and the mistakes one line
each, exit 2."""

import json
import shutil
from pathlib import Path

import pytest
from helpers import (
    DEBUG_CONFIG,
    TINY_RUN,
    expect_one_line,
    losses_by_step,
    preflight_cases,
    read_jsonl,
    run_script,
)

from titanlite.data import BUILTIN_DATASETS
from titanlite.data.prepare import prepare

# The suite's tiny run without its --config (each test writes its own), one block, 32 tokens.
TINY = [
    *TINY_RUN[2:],
    "--model.n_layers",
    "1",
    "--training.seq_len",
    "32",
    "--training.deterministic",
]
CHECKPOINTS = ["--checkpoint.enable_checkpoint", "--checkpoint.interval"]
PHASE_2 = (
    "\n[[data.phases]]\nstart_step = 6\nweights = { code = 0.1, prose_a = 0.1, prose_b = 0.8 }\n"
)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    corpus = Path(BUILTIN_DATASETS["titanlite_corpus"])
    prose = sorted(corpus.glob("prose_*"))
    groups = {"code": sorted(corpus.glob("code_*")), "prose_a": prose[:15], "prose_b": prose[15:]}
    root = tmp_path_factory.mktemp("sources")
    for name, files in groups.items():
        prepare(files, root / name, shard_mb=0.04, quiet=True)
    return {name: root / name for name in groups}


def _config(path: Path, sources: dict, weights: dict, extra: str = "", repeat: float = 100.0):
    """The debug preset with [[data.sources]], written to `path` (a tiny corpus: every source
    may repeat unless told)."""
    text = DEBUG_CONFIG.read_text()
    for name, weight in weights.items():
        text += (
            f'\n[[data.sources]]\nname = "{name}"\npath = "{sources[name]}"\n'
            f"weight = {weight}\nmax_repetition = {repeat}\n"
        )
    path.write_text(text + extra)
    return str(path)


def _train(config: str, folder: Path, *args: str, ngpu: str = "1"):
    argv = ["--config", config, *TINY, "--job.dump_folder", str(folder), *args]
    return run_script("run_train.sh", argv, timeout=300, NGPU=ngpu)


def test_two_sources_train_at_their_shares(tmp_path, sources):
    config = _config(tmp_path / "mix.toml", sources, {"code": 0.3, "prose_a": 0.7})
    out = tmp_path / "out"
    proc = _train(config, out, "--training.steps", "200", "--training.local_batch_size", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "data mixture: source, target share, achieved share" in proc.stderr
    last = read_jsonl(out / "metrics.jsonl")[-1]
    total = last["tokens_code"] + last["tokens_prose_a"]
    assert total == 200 * 2 * 32
    for name, target in (("code", 0.3), ("prose_a", 0.7)):
        assert abs(last[f"tokens_{name}"] / total - target) <= 0.01, last


def test_three_sources_with_phases_resume_exactly_and_on_two_ranks(tmp_path, sources):
    weights = {"code": 0.5, "prose_a": 0.3, "prose_b": 0.2}
    config = _config(tmp_path / "mix.toml", sources, weights, PHASE_2)
    run = ["--training.steps", "10", *CHECKPOINTS, "4"]
    full, again, two = tmp_path / "full", tmp_path / "again", tmp_path / "two"
    proc = _train(config, full, *run, "--training.local_batch_size", "4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for folder in (again, two):
        shutil.copytree(full / "checkpoint" / "step-4", folder / "checkpoint" / "step-4")
    same = _train(config, again, *run, "--training.local_batch_size", "4")
    other = _train(config, two, *run, "--training.local_batch_size", "2", ngpu="2")
    assert same.returncode == 0, same.stderr[-3000:]
    assert other.returncode == 0, other.stderr[-3000:]
    want = losses_by_step(full)
    assert losses_by_step(again) == {s: want[s] for s in range(5, 11)}  # bit-exact
    for step, loss in losses_by_step(two).items():
        assert abs(loss - want[step]) <= 1e-4 * want[step], (step, loss, want[step])
    records = {r["step"]: r for r in read_jsonl(full / "metrics.jsonl")}
    # From step 6 the phase takes 80% prose_b: 16 of its 5 steps x 4 windows, within a window.
    gained = records[10]["tokens_prose_b"] - records[5]["tokens_prose_b"]
    assert abs(gained / 32 - 16) <= 1, records[10]


def test_a_changed_mixture_and_bad_sources_are_one_line(tmp_path, sources):
    run = ["--training.steps", "4", *CHECKPOINTS, "2"]
    saved = tmp_path / "saved"
    mixed = _config(tmp_path / "mix.toml", sources, {"code": 0.5, "prose_a": 0.5})
    assert _train(mixed, saved, *run).returncode == 0
    changed = _config(tmp_path / "changed.toml", sources, {"code": 0.2, "prose_a": 0.8})
    shutil.copytree(saved / "checkpoint" / "step-2", tmp_path / "resume" / "checkpoint" / "step-2")
    proc = _train(changed, tmp_path / "resume", *run)
    expect_one_line(proc, 2, "read another mixture (the weights or phases changed")

    empty = tmp_path / "empty"
    empty.mkdir()
    other_tokenizer = tmp_path / "other"
    shutil.copytree(sources["code"], other_tokenizer)
    manifest = json.loads((other_tokenizer / "manifest.json").read_text())
    manifest["tokenizer"]["fingerprint"] = "0" * 16
    (other_tokenizer / "manifest.json").write_text(json.dumps(manifest))
    bad = {"missing": tmp_path / "nowhere", "empty": empty, "tokenizer": other_tokenizer}
    cases = {}
    for name, path in bad.items():
        config = _config(tmp_path / f"{name}.toml", {**sources, "x": path}, {"code": 1, "x": 1})
        cases[name] = (["--config", config], {})
    repeat = _config(tmp_path / "repeat.toml", sources, {"code": 1.0}, repeat=1.0)
    cases["repeat"] = (["--config", repeat, "--training.steps", "500"], {})
    negative = _config(tmp_path / "negative.toml", sources, {"code": 1.0, "prose_a": -0.5})
    cases["negative"] = (["--config", negative], {})
    got = preflight_cases(cases, shell=("repeat", "negative"))
    for name in bad:
        expect_one_line(got[name], 2, "data.sources.x.path")
    expect_one_line(got["repeat"], 2, "data source 'code' would be read", "max_repetition = 1")
    expect_one_line(got["negative"], 2, "[[data.sources]] #2 weight = -0.5: must be >= 0.0")
    assert not any("Traceback" in p.stderr for p in got.values())
