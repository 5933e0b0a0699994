"""A mixture of prepared sources (the bundled corpus split by kind): the global stream is the
same on 1 and 2 data-parallel ranks, each window is the scheduled source's own next window, the
achieved shares are the targets, and a resume continues exactly from the window count."""

from pathlib import Path

import pytest
import torch

from titanlite.data import BUILTIN_DATASETS
from titanlite.data.mixture_dataset import MixtureWindowDataset
from titanlite.data.mixture_schedule import MixtureSchedule, Phase
from titanlite.data.prepare import prepare
from titanlite.data.shard_dataset import ShardWindowDataset
from titanlite.data.shards import ShardSet

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
    assert state["consumed"] == 12 and sum(state["per_source"].values()) == 12
    resumed = _mixture(sources, (0.6, 0.4), 1, 2, batch=2)  # on 2 ranks now
    resumed.load_state_dict(state)
    assert torch.equal(_take(resumed, 2)[0], full[14])  # rank 1's first window: position 14
    with pytest.raises(Exception, match=r"weights or phases changed .*allow_mixture_change"):
        _mixture(sources, (0.5, 0.5)).load_state_dict(state)
    # Allowed: each source goes on from its recorded window, at the new weights.
    changed = _mixture(sources, (0.5, 0.5), allow=True)
    changed.load_state_dict(state)
    alone = {n: ShardWindowDataset(s, SEQ, 1, 0, 1, seed=3) for n, s in sources.items()}
    seen = dict(state["per_source"])
    for pos in range(12, 40):
        source, window = changed.window_at(pos)
        name = changed.names[source]
        assert (window == alone[name].window_at(seen[name])).all(), (pos, name)
        seen[name] += 1
    assert seen["code"] - state["per_source"]["code"] == 14  # half of the 28 windows


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
