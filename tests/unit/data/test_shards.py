"""Prepared shards: the round trip from text, the window stream across ranks and epochs, exact
resume and resharding of the loader position, and the checks that catch bad data."""

import json
import types

import numpy as np
import pytest

from titanlite.data import (
    BUILTIN_DATASETS,
    DatasetError,
    ShardSet,
    ShardWindowDataset,
    Tokenizer,
    build_dataloader,
    list_files,
    open_dataset,
)
from titanlite.data.prepare import main as prepare_main
from titanlite.data.prepare import prepare
from titanlite.data.rank_split import RankSplit
from titanlite.data.shard_dataset import WindowOrder
from titanlite.data.shards import dtype_for
from titanlite.data.text_dataset import read_stream
from titanlite.data.tokenizer import BUILTIN_TOKENIZER
from titanlite.preflight import checks as preflight

CORPUS = BUILTIN_DATASETS["titanlite_corpus"]
SEQ = 31  # windows of 32 tokens


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(BUILTIN_TOKENIZER)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The bundled corpus in several shards (windows span shard boundaries)."""
    out = tmp_path_factory.mktemp("shards")
    prepare([CORPUS], out, shard_mb=0.04, quiet=True)
    return out


def _windows(ds, n):
    it = iter(ds)
    return [np.concatenate([x.numpy(), y.numpy()[-1:]]) for x, y in (next(it) for _ in range(n))]


def _global(per_rank, lbs, dp, n):
    """Reassemble the global stream from each rank's windows by the ranks' split rule."""
    out = []
    for r, rows in enumerate(per_rank):
        for k in range(len(rows)):
            out.append((RankSplit(lbs, r, dp).position(k), rows[k]))
    out.sort(key=lambda p: p[0])
    assert [p for p, _ in out] == list(range(out[0][0], out[0][0] + len(out)))  # no gap, no repeat
    return [w for _, w in out][:n]


def test_round_trip_equals_on_the_fly_tokenization(prepared, tok):
    shards = ShardSet(prepared)
    assert len(shards.shards) > 2 and shards.manifest["dtype"] == "uint16"
    assert (dtype_for(65536), dtype_for(65537)) == ("uint16", "uint32")  # ids < vocab size
    stream = np.asarray(read_stream(list_files(CORPUS), tok), dtype=np.int64)
    assert np.array_equal(shards.tokens(0, shards.total_tokens), stream)
    # The index holds each document's boundaries: BOS at every start, EOS before every end.
    for i in range(len(shards.shards)):
        starts, data = shards.documents(i), np.fromfile(shards.bin_path(i), dtype="<u2")
        assert (data[starts[:-1]] == tok.bos_id).all() and (
            data[starts[1:] - 1] == tok.eos_id
        ).all()
    # One epoch of batches, on one rank, holds every window of that stream exactly once.
    ds = ShardWindowDataset(shards, SEQ, 4, 0, 1, seed=3)
    got = sorted(map(tuple, _windows(ds, ds.windows)))
    n = SEQ + 1
    want = sorted(tuple(stream[w * n : (w + 1) * n]) for w in range(len(stream) // n))
    assert got == want


def test_ranks_split_each_epoch_without_overlap_or_gap(prepared):
    shards = ShardSet(prepared)
    one = ShardWindowDataset(shards, SEQ, 12, 0, 1, seed=5)
    reference = _windows(one, 2 * one.windows)  # two epochs
    epoch0, epoch1 = reference[: one.windows], reference[one.windows :]
    assert sorted(map(tuple, epoch0)) == sorted(map(tuple, epoch1))  # same windows ...
    assert not all(np.array_equal(a, b) for a, b in zip(epoch0, epoch1))  # ... another order
    lbs, dp = 3, 4
    per_rank = [
        _windows(
            ShardWindowDataset(shards, SEQ, lbs, r, dp, seed=5), one.windows // (lbs * dp) * lbs
        )
        for r in range(dp)
    ]
    got = _global(per_rank, lbs, dp, len(per_rank[0]) * dp)
    assert all(np.array_equal(a, b) for a, b in zip(got, reference))


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1000, 4097])
def test_window_order_is_a_permutation_drawn_from_seed_and_epoch(n):
    order = [WindowOrder(n, 0, 0)(i) for i in range(n)]
    assert sorted(order) == list(range(n))
    if n >= 64:
        assert order != [WindowOrder(n, 0, 1)(i) for i in range(n)]
        assert order != [WindowOrder(n, 1, 0)(i) for i in range(n)]


def _loader_windows(loader_iter, steps):
    rows = []
    for _ in range(steps):
        x, y = next(loader_iter)
        rows.extend(np.concatenate([x.numpy(), y.numpy()[:, -1:]], axis=1))
    return rows


def _loaders(source, tok, lbs, dp, seed=1):
    return [
        build_dataloader(
            source, tok, seq_len=SEQ, local_batch_size=lbs, dp_rank=r, dp_size=dp, seed=seed
        )
        for r in range(dp)
    ]


@pytest.mark.parametrize("reader", ["shards", "text"])
def test_loader_state_is_one_position_that_resumes_on_other_layouts(prepared, tok, reader):
    """Saved from dp 2 (local batch 4), resumed on dp 1 (local 8: same global batch), dp 4
    (local 1: half the global batch) and dp 2 itself: the global stream continues exactly."""
    source = ShardSet(prepared) if reader == "shards" else list_files(CORPUS)
    full = _loaders(source, tok, 4, 2)
    iters = [iter(d) for d in full]
    steps_before, steps_after = 7, 30
    for it in iters:
        _loader_windows(it, steps_before)
    states = [d.state_dict() for d in full]
    assert states[0] == states[1]  # the same on every rank: DCP keeps one copy
    # The uninterrupted run's global stream from here on.
    per_rank = [_loader_windows(it, steps_after) for it in iters]
    reference = _global(per_rank, 4, 2, 8 * steps_after)
    for lbs, dp in ((8, 1), (1, 4), (4, 2)):
        resumed = _loaders(source, tok, lbs, dp, seed=99)  # another seed: the saved one is kept
        for d in resumed:
            d.load_state_dict(json.loads(json.dumps(states[0])))  # plain data, as DCP stores it
        per_rank = [_loader_windows(iter(d), 8 * steps_after // (lbs * dp)) for d in resumed]
        got = _global(per_rank, lbs, dp, 8 * steps_after)
        assert len(got) == len(reference)
        assert all(np.array_equal(a, b) for a, b in zip(got, reference)), (lbs, dp)


def test_resume_inside_a_micro_batch_with_the_same_layout(prepared):
    shards = ShardSet(prepared)
    for k in (37, 36):
        a = ShardWindowDataset(shards, SEQ, 2, 1, 2, seed=7)
        it = iter(a)
        for _ in range(k):
            next(it)
        state = a.state_dict()
        expected = [next(it) for _ in range(25)]
        b = ShardWindowDataset(shards, SEQ, 2, 1, 2, seed=7)
        b.load_state_dict(state)
        got = [x for x, _ in zip(b, range(25))]
        assert all(x.equal(u) and y.equal(v) for (x, y), (u, v) in zip(expected, got))


def test_resume_refuses_another_dataset_or_seq_len(prepared, tmp_path):
    state = ShardWindowDataset(ShardSet(prepared), SEQ, 2, 0, 1).state_dict()
    with pytest.raises(
        DatasetError, match="counts windows of training.seq_len = 31, this run has 15"
    ):
        ShardWindowDataset(ShardSet(prepared), 15, 2, 0, 1).load_state_dict(state)
    (tmp_path / "other.txt").write_text("another corpus " * 200)
    prepare([tmp_path / "other.txt"], tmp_path / "other", quiet=True)
    with pytest.raises(DatasetError, match="another prepared dataset.*exclude_from_loading"):
        ShardWindowDataset(ShardSet(tmp_path / "other"), SEQ, 2, 0, 1).load_state_dict(state)


def test_jsonl_and_parquet_inputs_and_bad_records(tok, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "src"
    src.mkdir()
    lines = [
        json.dumps({"text": "first document"}),
        "{broken",
        json.dumps({"body": "x"}),
        json.dumps({"text": "second document"}),
    ]
    (src / "a.jsonl").write_text("\n".join(lines) + "\n")
    table = pa.table({"text": ["row zero", None, "row two"], "id": [0, 1, 2]})
    pq.write_table(table, src / "b.parquet", row_group_size=2)
    out = tmp_path / "out"
    manifest = prepare([src], out, shard_mb=1e-5, quiet=True)  # a shard per segment
    assert manifest["skipped_records"] == 3
    examples = manifest["skipped_examples"]
    assert examples[0].startswith(f"{src / 'a.jsonl'}:2:") and examples[1].startswith(
        f"{src / 'a.jsonl'}:3:"
    )
    assert examples[2].startswith(f"{src / 'b.parquet'}:row 1:")
    docs = ["first document", "second document", "row zero", "row two"]
    want = [t for ids in tok.encode_documents(docs) for t in ids]
    shards = ShardSet(out)
    assert shards.tokens(0, shards.total_tokens).tolist() == want
    assert shards.tokens(0, shards.total_tokens).tolist() == read_stream(list_files(src), tok)


def test_prepare_resumes_and_refuses_another_tokenizer(prepared, tmp_path):
    out = tmp_path / "copy"
    prepare([CORPUS], out, shard_mb=0.04, workers=2, quiet=True)  # worker processes
    assert json.loads((out / "manifest.json").read_text()) == json.loads(
        (prepared / "manifest.json").read_text()
    )
    (out / "shard_00001.json").unlink()  # as if killed while writing shard 1
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("shard_*.bin")}
    prepare([CORPUS], out, shard_mb=0.04, quiet=True)
    after = {p.name: p.stat().st_mtime_ns for p in out.glob("shard_*.bin")}
    assert [n for n in before if before[n] != after[n]] == ["shard_00001.bin"]
    assert json.loads((out / "manifest.json").read_text()) == json.loads(
        (prepared / "manifest.json").read_text()
    )
    other = json.loads((out / "shard_00000.json").read_text())
    other["tokenizer"] = "0123456789abcdef"
    (out / "shard_00000.json").write_text(json.dumps(other))
    with pytest.raises(DatasetError, match="holds shards made with another tokenizer"):
        prepare([CORPUS], out, quiet=True)


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_checks_name_the_shard_and_the_fix(prepared, tok, tmp_path, capsys):
    assert isinstance(open_dataset(prepared, tok), ShardSet)
    assert isinstance(open_dataset(CORPUS, tok), list)
    # A flipped byte: only the checksum sees it.
    bad = _copy(prepared, tmp_path / "flip")
    data = bytearray((bad / "shard_00002.bin").read_bytes())
    data[100] ^= 0x01
    (bad / "shard_00002.bin").write_bytes(bytes(data))
    open_dataset(bad, tok)
    problems = ShardSet(bad).verify_checksums()
    assert len(problems) == 1 and f"{bad / 'shard_00002.bin'} is corrupted" in problems[0]
    assert prepare_main(["--verify", str(bad)]) == 1
    # A truncated shard: a size mismatch, caught by the cheap checks.
    cut = _copy(prepared, tmp_path / "cut")
    (cut / "shard_00001.bin").write_bytes((cut / "shard_00001.bin").read_bytes()[:-2])
    with pytest.raises(
        DatasetError, match=r"shard file .*shard_00001.bin has \d+ bytes, the manifest says"
    ):
        open_dataset(cut, tok)
    assert preflight.main(["--training.dataset_path", str(cut)]) == 2  # one line, exit 2
    assert (
        f"titanlite: error: training.dataset_path: shard file {cut / 'shard_00001.bin'}"
        in capsys.readouterr().err
    )
    # A manifest from another tokenizer.
    other = _copy(prepared, tmp_path / "other")
    m = json.loads((other / "manifest.json").read_text())
    m["tokenizer"]["fingerprint"] = "0123456789abcdef"
    (other / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(
        DatasetError, match="prepared with another tokenizer.*set model.tokenizer_path"
    ):
        open_dataset(other, tok)
    # Ids beyond the model's vocabulary, a shard without EOS, a dtype that is not the file's.
    shards = ShardSet(prepared)
    with pytest.raises(
        DatasetError,
        match=r"shard_00000.bin holds token id \d+, beyond the model's vocabulary of 100",
    ):
        shards.check(100, tok.fingerprint, tok.path)
    for field, value, message in (
        ("eos_count", 0, "holds no EOS token"),
        ("dtype", "uint32", "has .* bytes, the manifest says"),
    ):
        broken = _copy(prepared, tmp_path / field)
        m = json.loads((broken / "manifest.json").read_text())
        if field == "dtype":
            m["dtype"] = value
        else:
            m["shards"][0][field] = value
        (broken / "manifest.json").write_text(json.dumps(m))
        with pytest.raises(DatasetError, match=message):
            open_dataset(broken, tok)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # DCP in one process
def test_checkpoint_of_the_other_reader_is_one_clear_error(prepared, tok, tmp_path):
    import torch.distributed.checkpoint as dcp

    from titanlite.components.checkpoint.folder import CheckpointError
    from titanlite.components.checkpoint.manager import CheckpointManager
    from titanlite.components.checkpoint.storage import read_metadata

    text, shards = (
        _loaders(list_files(CORPUS), tok, 2, 1)[0],
        _loaders(ShardSet(prepared), tok, 2, 1)[0],
    )
    dcp.save({"dataloader": text}, checkpoint_id=str(tmp_path))
    saved = read_metadata(tmp_path).state_dict_metadata
    check = CheckpointManager._check_loader_state
    check(types.SimpleNamespace(states={"dataloader": text}), tmp_path, saved)  # same reader: fine
    with pytest.raises(
        CheckpointError, match="saved by another reader.*exclude_from_loading dataloader"
    ):
        check(types.SimpleNamespace(states={"dataloader": shards}), tmp_path, saved)
