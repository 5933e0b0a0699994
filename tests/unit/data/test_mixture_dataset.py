"""A mixture of prepared sources (the bundled corpus split by kind): the global stream is the
same on 1 and 2 data-parallel ranks, each window is the scheduled source's own next window, the
achieved shares are the targets, and a resume continues exactly from the window count. With a
text source (the prose files, tokenized as read): the same on 1 and 2 ranks, with the same state
on both at every micro-batch boundary, each of its windows its own stream's next, a resume exact
onto another degree, and its max_repetition enforced as it is read."""

import json
from pathlib import Path

import pytest
import torch

from titanlite.config.schema import JobConfig
from titanlite.data import BUILTIN_DATASETS
from titanlite.data.documents import DatasetError
from titanlite.data.mixture import Mixture, describe
from titanlite.data.mixture_dataset import MixtureWindowDataset
from titanlite.data.mixture_schedule import MixtureSchedule, Phase
from titanlite.data.mixture_text import TextWindows
from titanlite.data.prepare import prepare
from titanlite.data.shard_dataset import ShardWindowDataset
from titanlite.data.shards import ShardSet
from titanlite.data.text_dataset import PackedTextDataset, read_stream
from titanlite.data.tokenizer import BUILTIN_TOKENIZER, Tokenizer
from titanlite.preflight.data import check_windows

SEQ = 32


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, ShardSet]:
    corpus = Path(BUILTIN_DATASETS["titanlite_corpus"])
    out = {}
    for kind in ("code", "prose"):
        files = sorted(corpus.glob(f"{kind}_*"))
        assert files, kind
        folder = tmp_path_factory.mktemp(kind)
        prepare(files, folder / "shards", shard_mb=0.04, quiet=True)
        out[kind] = ShardSet(folder / "shards")
    return out


def _mixture(sources, weights, dp_rank=0, dp_size=1, batch=4, phases=(), allow=False):
    names = list(sources)
    streams = [ShardWindowDataset(s, SEQ, batch, 0, 1, seed=3) for s in sources.values()]
    schedule = MixtureSchedule([Phase(0, weights), *phases])
    return MixtureWindowDataset(names, streams, schedule, batch, dp_rank, dp_size, allow)


def _take(dataset, n):
    it = iter(dataset)
    return [next(it)[0] for _ in range(n)]


def test_the_stream_is_the_same_on_one_and_two_ranks(sources):
    one = _take(_mixture(sources, (0.7, 0.3), batch=4), 40)
    ranks = [_take(_mixture(sources, (0.7, 0.3), r, 2, batch=2), 20) for r in range(2)]
    merged = [w for step in range(10) for r in range(2) for w in ranks[r][2 * step : 2 * step + 2]]
    assert all(torch.equal(a, b) for a, b in zip(one, merged))


def test_each_window_is_its_sources_next_and_the_shares_are_the_targets(sources):
    mix = _mixture(sources, (0.7, 0.3))
    alone = {n: ShardWindowDataset(s, SEQ, 1, 0, 1, seed=3) for n, s in sources.items()}
    seen = dict.fromkeys(sources, 0)
    for pos in range(1000):
        source, window = mix.window_at(pos)
        name = mix.names[source]
        assert (window == alone[name].window_at(seen[name])).all()
        seen[name] += 1
    assert seen == {"code": 700, "prose": 300}


def test_a_resume_continues_exactly_and_a_changed_mixture_is_refused(sources):
    full = _take(_mixture(sources, (0.6, 0.4)), 24)
    first = _mixture(sources, (0.6, 0.4))
    _take(first, 12)
    state = first.state_dict()
    assert state["consumed"] == 12 and sum(json.loads(state["per_source"]).values()) == 12
    resumed = _mixture(sources, (0.6, 0.4), 1, 2, batch=2)  # on 2 ranks now
    resumed.load_state_dict(state)
    assert torch.equal(_take(resumed, 2)[0], full[14])  # rank 1's first window: position 14
    with pytest.raises(Exception, match=r"weights or phases changed .*allow_mixture_change"):
        _mixture(sources, (0.5, 0.5)).load_state_dict(state)
    # Allowed: each source goes on from its recorded window, at the new weights.
    changed = _mixture(sources, (0.5, 0.5), allow=True)
    changed.load_state_dict(state)
    alone = {n: ShardWindowDataset(s, SEQ, 1, 0, 1, seed=3) for n, s in sources.items()}
    seen = json.loads(state["per_source"])
    for pos in range(12, 40):
        source, window = changed.window_at(pos)
        name = changed.names[source]
        assert (window == alone[name].window_at(seen[name])).all(), (pos, name)
        seen[name] += 1
    assert seen["code"] - json.loads(state["per_source"])["code"] == 14  # half of the 28 windows


def test_the_plan_counts_shares_epochs_and_when_a_source_runs_out(sources):
    from titanlite.data.mixture import Mixture

    shards = list(sources.values())
    mix = Mixture(list(sources), shards, [(1, (0.5, 0.5)), (11, (0.0, 1.0))], [1.0, 1.0])
    rows = mix.plan(steps=20, windows_per_step=8, seq_len=SEQ)
    assert [r.windows for r in rows] == [40, 120]  # 10 steps at half, then 10 at all-prose
    assert [round(r.target, 3) for r in rows] == [0.25, 0.75]
    assert rows[0].epochs == 40 / shards[0].num_windows(SEQ)
    code_epoch = shards[0].num_windows(SEQ)  # 26,033 tokens: 788 windows of 33
    # Every step half code: its epoch ends after code_epoch / 4 steps.
    long = Mixture(list(sources), shards, [(1, (0.5, 0.5))], [1.0, 100.0])
    [code, _] = long.plan(steps=1000, windows_per_step=8, seq_len=SEQ)
    assert code.exhausted_at == code_epoch // 4 + 1
    with pytest.raises(Exception, match="'code' would be read .*past max_repetition = 1 at step"):
        long.check_finite(1000, 8, SEQ)


def test_document_weights_are_shares_of_documents(sources):
    """weight_unit = "documents": equal weights give each source an equal number of documents,
    so the source of longer documents takes more windows."""
    from titanlite.data.mixture import Mixture, _documents

    shards = list(sources.values())
    mix = Mixture(list(sources), shards, [(1, (1.0, 1.0))], [100.0, 100.0], "documents")
    ((_, weights),) = mix.phases
    mean = [s.total_tokens / _documents(s) for s in shards]
    assert weights[0] / weights[1] == pytest.approx(mean[0] / mean[1])


# ---------------------------------------------------------------------------------------------
# a text source


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(BUILTIN_TOKENIZER)


PROSE = sorted(Path(BUILTIN_DATASETS["titanlite_corpus"]).glob("prose_*"))


def _text_mixture(
    sources, tok, weights, dp_rank=0, dp_size=1, batch=4, files=PROSE, limit=100.0, allow=False
):
    """code (prepared) and prose (text, tokenized alone: no group)."""
    code = ShardWindowDataset(sources["code"], SEQ, 1, 0, 1, seed=3)
    prose = TextWindows("prose", files, tok, SEQ, 3, prefetch=False, max_repetition=limit)
    schedule = MixtureSchedule([Phase(0, weights)])
    return MixtureWindowDataset(
        ["code", "prose"], [code, prose], schedule, batch, dp_rank, dp_size, allow, 8
    )


def _text_alone(tok, files=PROSE):
    """The text source's stream on its own: training.dataset_path's reader on one rank."""
    return [
        torch.cat([x, y[-1:]])
        for x, y in _take_pairs(PackedTextDataset(files, tok, SEQ, 1, 0, 1, 3, prefetch=False))
    ]


def _take_pairs(dataset, n=200):
    it = iter(dataset)
    return [next(it) for _ in range(n)]


def test_a_text_source_reads_the_same_stream_and_state_on_one_and_two_ranks(sources, tok):
    one = _text_mixture(sources, tok, (0.5, 0.5), batch=4)
    full = _take(one, 40)
    ranks = [_text_mixture(sources, tok, (0.5, 0.5), r, 2, batch=2) for r in range(2)]
    its = [iter(r) for r in ranks]
    merged = []
    for step in range(10):
        for it in its:
            merged += [next(it)[0] for _ in range(2)]
        # Between micro-batches both ranks' text positions (and so their states) are the same:
        # DCP keeps one copy, and their tokenizing exchanges stay paired.
        assert ranks[0].state_dict() == ranks[1].state_dict(), step
    for d in (one, *ranks):
        d.close()
    assert all(torch.equal(a, b) for a, b in zip(full, merged))
    # Each prose window is its index's window of the prose stream read on its own (dp 1).
    alone = _text_alone(tok)
    prose = [(one.schedule(pos)[1], w) for pos, w in enumerate(full) if one.schedule(pos)[0]]
    assert [k for k, _ in prose] == list(range(20))
    assert all(torch.equal(w, alone[k][:-1]) for k, w in prose)


def test_every_rank_reads_its_text_sources_refills_in_one_order(sources, tok, tmp_path):
    """Each text source's reader exchanges on a group of its own, a few refills ahead of its
    rank's use: two ranks taking two sources' refills in different orders could each wait on
    the other's. Every rank takes them in the same order (here refills of a paragraph or two,
    several a micro-batch)."""
    halves = {"prose_a": PROSE[:13], "prose_b": PROSE[13:]}
    for name, files in halves.items():
        paragraphs = [p for f in files for p in f.read_text().split("\n\n") if p.strip()]
        lines = [json.dumps({"text": p}) for p in paragraphs]
        (tmp_path / f"{name}.jsonl").write_text("\n".join(lines))
    logs: list[list[str]] = [[], []]
    ranks = []
    for r in range(2):
        code = ShardWindowDataset(sources["code"], SEQ, 1, 0, 1, seed=3)
        texts = [
            TextWindows(n, [tmp_path / f"{n}.jsonl"], tok, SEQ, 3, prefetch=False) for n in halves
        ]
        for text in texts:
            fill, text.stream._fill_chars = text.stream._fill, 300
            text.stream._fill = lambda fill=fill, log=logs[r], n=text.name: (log.append(n), fill())
        schedule = MixtureSchedule([Phase(0, (0.2, 0.4, 0.4))])
        ranks.append(MixtureWindowDataset(["code", *halves], [code, *texts], schedule, 3, r, 2))
    its = [iter(r) for r in ranks]
    for _ in range(60):
        for it in its:
            [next(it) for _ in range(3)]
    assert len(logs[0]) > 30 and logs[0] == logs[1]


def test_a_text_source_resumes_exactly_on_another_degree(sources, tok):
    full = _take(_text_mixture(sources, tok, (0.6, 0.4)), 24)
    first = _text_mixture(sources, tok, (0.6, 0.4))
    _take(first, 12)
    state = first.state_dict()
    first.close()
    assert (
        json.loads(state["text"])["prose"]["window_idx"] == json.loads(state["per_source"])["prose"]
    )
    state = json.loads(json.dumps(state))  # plain data, as a checkpoint keeps it
    same = _text_mixture(sources, tok, (0.6, 0.4))
    same.load_state_dict(state)
    assert (
        same.sources[1].position == json.loads(state["per_source"])["prose"]
    )  # not read again from 0
    assert all(torch.equal(a, b) for a, b in zip(_take(same, 12), full[12:]))
    ranks = [_text_mixture(sources, tok, (0.6, 0.4), r, 2, batch=2) for r in range(2)]
    for r in ranks:
        r.load_state_dict(state)
    got = [_take(r, 6) for r in ranks]
    merged = [w for step in range(3) for r in range(2) for w in got[r][2 * step : 2 * step + 2]]
    assert all(torch.equal(a, b) for a, b in zip(merged, full[12:]))
    # Another mixture, allowed: the text source goes on from its recorded window.
    changed = _text_mixture(sources, tok, (0.2, 0.8), allow=True)
    changed.load_state_dict(state)
    alone, seen = _text_alone(tok), json.loads(state["per_source"])["prose"]
    for pos in range(12, 30):
        source, window = changed.window_at(pos)
        if source == 1:
            assert (window == alone[seen].numpy()).all(), pos
            seen += 1
    for d in (same, changed, *ranks):
        d.close()


def test_a_text_source_read_past_max_repetition_stops_at_a_micro_batch_boundary(sources, tok):
    files = PROSE[:2]
    epoch = len(read_stream(files, tok))  # tokens an epoch (the order does not change them)
    mix = _text_mixture(sources, tok, (0.0, 1.0), files=files, limit=1.0)
    it, read = iter(mix), 0
    with pytest.raises(DatasetError) as error:
        for _ in range(1000):  # 4 epochs of it
            next(it)
            read += 1
    mix.close()
    # The micro-batch that would take it past one epoch is not completed (its last window is
    # never yielded, so the loader never hands it out): the whole ones before it are within.
    done = read - read % 4
    assert read % 4 == 3 and done * (SEQ + 1) <= epoch < (done + 4) * (SEQ + 1), (read, epoch)
    line = str(error.value)
    assert "\n" not in line and "data source 'prose' (text, data.sources.prose.path)" in line
    assert (
        f"at step {done // 8 + 1}, past max_repetition = 1 (an epoch of it is {epoch:,} tokens)"
        in line
    )


def test_the_plan_of_a_text_source_and_what_it_cannot_do(sources, tok, tmp_path):
    data = [sources["code"], PROSE]
    mix = Mixture(["code", "prose"], data, [(1, (0.5, 0.5))], [100.0, 1.0])
    code, prose = mix.check_finite(steps=10, windows_per_step=8, seq_len=SEQ)
    assert (prose.windows, prose.epochs, prose.exhausted_at) == (40, None, None)
    assert "unknown (text)" in describe([code, prose])
    assert mix.shards == [sources["code"]] and mix.text_sources == [1]
    below = Mixture(["code", "prose"], data, [(1, (0.5, 0.5))], [100.0, 0.5])
    with pytest.raises(DatasetError, match=r"data.sources.prose.max_repetition = 0.5: a text"):
        below.check_finite(10, 8, SEQ)
    with pytest.raises(DatasetError, match=r'"documents" .*\(data.sources.prose.path\)'):
        Mixture(["code", "prose"], data, [(1, (1.0, 1.0))], [1.0, 1.0], "documents")
    # Preflight reads a text source only until its first window is full.
    (tmp_path / "tiny.txt").write_text("too short")
    tiny = Mixture(
        ["code", "tiny"], [sources["code"], [tmp_path / "tiny.txt"]], [(1, (1, 1))], [1, 1]
    )
    job = JobConfig()
    job.training.seq_len, job.training.steps = SEQ, 10
    check_windows(job, mix, {}, tok, 8)
    with pytest.raises(
        DatasetError, match=r"^data.sources.tiny.path's data \(1 file\(s\), .*holds"
    ):
        check_windows(job, tiny, {}, tok, 8)
