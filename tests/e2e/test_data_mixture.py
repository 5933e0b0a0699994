"""Data mixtures from the command line: the bundled corpus split into prepared sources (code,
two halves of the prose), trained through ./run_train.sh with weights and phases; the plan line,
the per-source token counts and achieved shares in metrics.jsonl and TensorBoard against the
targets, an exact resume (the same layout) and one across data-parallel degrees 4 -> 2 -> 1, and
the mistakes one line each, exit 2 (the launcher's preflight; a few through ./run_train.sh)."""

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
PHASE = "\n[[data.phases]]\nstart_step = {}\nweights = {{ code = 1.0 }}\n"
PHASE_2 = (
    "\n[[data.phases]]\nstart_step = 4\nweights = { code = 0.1, prose_a = 0.1, prose_b = 0.8 }\n"
)


TWO = {"code": 0.5, "prose_a": 0.5}
# The config mistakes, each through the launcher's preflight: (weights, extra TOML), its line.
CONFIG_MISTAKES = {
    "all_zero": ({"code": 0.0, "prose_a": 0.0}, ""),
    "nan": ({"code": "nan", "prose_a": 1.0}, ""),
    "infinite": ({"code": "inf", "prose_a": 1.0}, ""),
    "duplicate": ({"code": 0.5}, '\n[[data.sources]]\nname = "code"\npath = "/x"\n'),
    "phases_out_of_order": (TWO, PHASE.format(6) + PHASE.format(4)),
    "phase_past_the_end": (TWO, PHASE.format(11)),
}
CONFIG_MISTAKE_LINES = {
    "all_zero": "every weight is 0; give at least one source a weight",
    "nan": "[[data.sources]] #1 weight = nan: expected a finite number",
    "infinite": "[[data.sources]] #1 weight = inf: expected a finite number",
    "duplicate": "two sources are named 'code'",
    "phases_out_of_order": "start_step = 4: phases must start after step 1 and in increasing",
    "phase_past_the_end": "start_step = 11 is past training.steps = 10",
}


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
    tb = ("--metrics.enable_tensorboard", "true", "--metrics.log_freq", "50")
    steps = ("--training.steps", "200", "--training.local_batch_size", "2")
    proc = _train(config, out, *steps, *tb)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "data mixture: source, target share, achieved share" in proc.stderr
    last = read_jsonl(out / "metrics.jsonl")[-1]
    total = last["tokens_code"] + last["tokens_prose_a"]
    assert total == 200 * 2 * 32
    for name, target in (("code", 0.3), ("prose_a", 0.7)):
        assert abs(last[f"tokens_{name}"] / total - target) <= 0.01, last
        assert last["data_share"][name] == last[f"tokens_{name}"] / total
    # TensorBoard has each source's achieved share and tokens, every logged step.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (run,) = (out / "tb").glob("run-*")
    events = EventAccumulator(str(run))
    events.Reload()
    for name in ("code", "prose_a"):
        shares = events.Scalars(f"data/share/{name}")
        assert [e.step for e in shares] == [1, 50, 100, 150, 200]
        assert shares[-1].value == pytest.approx(last["data_share"][name])
        assert events.Scalars(f"data/tokens/{name}")[-1].value == last[f"tokens_{name}"]


def test_three_sources_with_phases_resume_from_4_to_2_to_1_ranks(tmp_path, sources):
    """One process uninterrupted, 6 steps (a phase from step 4), and a chain whose steps 1-2
    are trained on 4 data-parallel ranks, 3-4 on 2, 5-6 on one process, each leg resumed from
    the previous leg's save (within 1e-4 of the uninterrupted run; the phase starts after a
    resume). Each leg runs on to step 6 (training.steps sets the learning-rate schedule): the
    chain takes its steps up to its save. (A bit-exact resume on the same layout: the text
    sources' test below, whose mixture holds a prepared source too.)"""
    weights = {"code": 0.5, "prose_a": 0.3, "prose_b": 0.2}
    config = _config(tmp_path / "mix.toml", sources, weights, PHASE_2)
    full = tmp_path / "full"
    proc = _train(config, full, "--training.steps", "6", "--training.local_batch_size", "4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    want = losses_by_step(full)
    chain, previous = {}, None
    for ranks, first, last in ((4, 1, 2), (2, 3, 4), (1, 5, 6)):
        folder = tmp_path / f"dp{ranks}"
        if previous is not None:
            _copy_step(previous, first - 1, folder)
        stop = ["--training.steps", "6", *CHECKPOINTS, str(last)]
        lbs = ["--training.local_batch_size", str(4 // ranks)]
        proc = _train(config, folder, *stop, *lbs, ngpu=str(ranks))
        assert proc.returncode == 0, (ranks, proc.stderr[-3000:])
        chain.update({s: v for s, v in losses_by_step(folder).items() if first <= s <= last})
        previous = folder
    assert sorted(chain) == list(range(1, 7))
    for step, loss in chain.items():
        assert abs(loss - want[step]) <= 1e-4 * want[step], (step, loss, want[step])
    records = {r["step"]: r for r in read_jsonl(full / "metrics.jsonl")}
    # From step 4 the phase takes 80% prose_b: 9.6 of its 3 steps x 4 windows, within a window.
    gained = records[6]["tokens_prose_b"] - records[3]["tokens_prose_b"]
    assert abs(gained / 32 - 9.6) <= 1, records[6]


def _copy_step(run: Path, step: int, to: Path) -> None:
    shutil.copytree(run / "checkpoint" / f"step-{step}", to / "checkpoint" / f"step-{step}")


def test_a_changed_mixture_and_bad_sources_are_one_line(tmp_path, sources):
    run = ["--training.steps", "4", *CHECKPOINTS, "2"]
    saved = tmp_path / "saved"
    mixed = _config(tmp_path / "mix.toml", sources, {"code": 0.5, "prose_a": 0.5})
    assert _train(mixed, saved, *run).returncode == 0
    changed = _config(tmp_path / "changed.toml", sources, {"code": 0.2, "prose_a": 0.8})
    shutil.copytree(saved / "checkpoint" / "step-2", tmp_path / "resume" / "checkpoint" / "step-2")
    proc = _train(changed, tmp_path / "resume", *run)
    expect_one_line(proc, 2, "read another mixture (the weights or phases changed")
    # Allowed, with a source the checkpoint never saw: each source goes on from its recorded
    # position, the new one from its start: steps 3-4 (2 x 8 windows) at the new weights.
    grown = _config(tmp_path / "grown.toml", sources, {"code": 1, "prose_a": 1, "prose_b": 2})
    proc = _train(grown, tmp_path / "resume", *run, "--data.allow_mixture_change", "true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved_at_2 = read_jsonl(saved / "metrics.jsonl")[1]
    last = read_jsonl(tmp_path / "resume" / "metrics.jsonl")[-1]
    for name, share in (("code", 1), ("prose_a", 1), ("prose_b", 2)):
        gained = last[f"tokens_{name}"] - saved_at_2.get(f"tokens_{name}", 0)
        assert gained == 2 * 8 * share / 4 * 32, (name, saved_at_2, last)

    empty = tmp_path / "empty"
    empty.mkdir()
    other_tokenizer = tmp_path / "other"
    shutil.copytree(sources["code"], other_tokenizer)
    manifest = json.loads((other_tokenizer / "manifest.json").read_text())
    manifest["tokenizer"]["fingerprint"] = "0" * 16
    (other_tokenizer / "manifest.json").write_text(json.dumps(manifest))
    past_vocabulary = tmp_path / "vocabulary"
    shutil.copytree(sources["code"], past_vocabulary)
    manifest = json.loads((past_vocabulary / "manifest.json").read_text())
    manifest["shards"][0]["max_id"] = 10**6
    (past_vocabulary / "manifest.json").write_text(json.dumps(manifest))
    bad = {
        "missing": tmp_path / "nowhere",
        "empty": empty,
        "tokenizer": other_tokenizer,
        "vocabulary": past_vocabulary,
    }
    cases = {}
    for name, path in bad.items():
        config = _config(tmp_path / f"{name}.toml", {**sources, "x": path}, {"code": 1, "x": 1})
        cases[name] = (["--config", config], {})
    repeat = _config(tmp_path / "repeat.toml", sources, {"code": 1.0}, repeat=1.0)
    cases["repeat"] = (["--config", repeat, "--training.steps", "500"], {})
    # The dry run prints its whole plan, the overrun marked, then refuses as training would.
    cases["repeat_dry_run"] = (["--config", repeat, "--training.steps", "500", "--dry-run"], {})
    negative = _config(tmp_path / "negative.toml", sources, {"code": 1.0, "prose_a": -0.5})
    cases["negative"] = (["--config", negative], {})
    for name, (weights, extra) in CONFIG_MISTAKES.items():
        config = _config(tmp_path / f"{name}.toml", sources, weights, extra)
        cases[name] = (["--config", config, "--training.steps", "10"], {})
    # A named held-out set's mistake: [[validation.sources]] go through the same tables.
    held_out = _config(tmp_path / "held_out.toml", sources, TWO)
    text = Path(held_out).read_text() + "\n[validation]\nenabled = true\n"
    text += '\n[[validation.sources]]\nname = "a"\npath = "/x"\n' * 2
    Path(held_out).write_text(text)
    cases["held_out"] = (["--config", held_out], {})
    got = preflight_cases(cases, shell=("repeat", "repeat_dry_run", "negative", "held_out"))
    for name in bad:
        expect_one_line(got[name], 2, "data.sources.x.path")
    expect_one_line(got["repeat"], 2, "data source 'code' would be read", "max_repetition = 1")
    expect_one_line(got["repeat_dry_run"], 2, "data source 'code' would be read", "at step ")
    plan = got["repeat_dry_run"].stdout
    assert plan.startswith("dry run: llama3 debugmodel"), plan  # the memory plan too
    assert "data mixture: source, target share" in plan and "OVERRUN: code would be read" in plan
    expect_one_line(got["negative"], 2, "[[data.sources]] #2 weight = -0.5: must be >= 0.0")
    expect_one_line(got["held_out"], 2, "[[validation.sources]]: two sources are named 'a'")
    expect_one_line(got["vocabulary"], 2, "token id 1000000, beyond the model's vocabulary")
    for name, line in CONFIG_MISTAKE_LINES.items():
        expect_one_line(got[name], 2, line)
    assert not any("Traceback" in p.stderr for p in got.values())


def test_text_sources_beside_a_prepared_one_on_two_ranks_resume_exactly(tmp_path, sources):
    """The prose as two text sources (tokenized as read, each shared by the two ranks on a group
    of its own) beside the prepared code: the shares of 10 steps of 4 windows, a resume from
    step 4 bit-exact with the uninterrupted run, and one on one process within 1e-4. (Two text sources: ranks that took their
    refills in different orders would wait on each other here; a hang ends in the timeout.)"""
    prose = sorted(Path(BUILTIN_DATASETS["titanlite_corpus"]).glob("prose_*"))
    texts = {"text_a": tmp_path / "text_a", "text_b": tmp_path / "text_b"}
    for folder, files in zip(texts.values(), (prose[:13], prose[13:])):
        folder.mkdir()
        for f in files:
            shutil.copy(f, folder / f.name)
    weights = {"code": 0.4, "text_a": 0.3, "text_b": 0.3}
    config = _config(tmp_path / "mix.toml", {**sources, **texts}, weights)
    run = ["--training.steps", "10", *CHECKPOINTS, "4", "--training.local_batch_size", "2"]
    full, again = tmp_path / "full", tmp_path / "again"
    proc = _train(config, full, *run, ngpu="2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "unknown (text)" in proc.stderr  # the plan: a text source's epochs
    last = read_jsonl(full / "metrics.jsonl")[-1]
    assert sum(last[f"tokens_{name}"] for name in weights) == 10 * 4 * 32
    for name, weight in weights.items():  # of 40 windows, within one
        assert abs(last[f"tokens_{name}"] / 32 - 40 * weight) <= 1, last
    shutil.copytree(full / "checkpoint" / "step-4", again / "checkpoint" / "step-4")
    resumed = _train(config, again, *run, ngpu="2")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    want = losses_by_step(full)
    assert losses_by_step(again) == {s: want[s] for s in range(5, 11)}  # bit-exact
    # On one process: each text reader goes on from the position both ranks recorded.
    one = tmp_path / "one"
    _copy_step(full, 4, one)
    alone = _train(config, one, *run[:-2], "--training.local_batch_size", "4")
    assert alone.returncode == 0, alone.stderr[-3000:]
    for step, loss in losses_by_step(one).items():
        assert abs(loss - want[step]) <= 1e-4 * want[step], (step, loss, want[step])
    assert sorted(losses_by_step(one)) == list(range(5, 11))


def test_a_text_source_read_past_max_repetition_stops_the_run_with_one_line(tmp_path, sources):
    """A text source's size is known only once read through: one prose file beside the
    prepared code, allowed 1 epoch, runs out during training; the run stops with one line
    (exit 2) at the micro-batch that would pass it, before training on it."""
    one = tmp_path / "one_file"
    one.mkdir()
    shutil.copy(sorted(Path(BUILTIN_DATASETS["titanlite_corpus"]).glob("prose_*"))[0], one)
    config = _config(tmp_path / "mix.toml", {**sources, "one": one}, {"code": 1, "one": 1})
    head, tail = Path(config).read_text().rsplit("max_repetition = 100.0", 1)  # "one"'s
    Path(config).write_text(head + "max_repetition = 1.0" + tail)
    proc = _train(config, tmp_path / "out", "--training.steps", "200")
    expect_one_line(
        proc,
        2,
        "data source 'one' (text, data.sources.one.path) would be read",
        "max_repetition = 1",
    )
    steps = [r["step"] for r in read_jsonl(tmp_path / "out" / "metrics.jsonl")]
    assert steps and steps[-1] < 200, steps
