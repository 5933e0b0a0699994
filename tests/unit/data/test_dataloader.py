import json

import pytest
from helpers import corpus_paragraphs, save_hf_dataset

from titanlite.data import BUILTIN_DATASETS, DatasetError, PackedTextDataset, Tokenizer, list_files
from titanlite.data.split_tokenize import split_by_chars
from titanlite.data.tokenizer import BUILTIN_TOKENIZER, TokenizerError, resolve_tokenizer_path


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(BUILTIN_TOKENIZER)


def _stream(tok, files, seed=0):
    """The global token stream of one epoch, as the dataset would read it."""
    ds = PackedTextDataset(files, tok, 8, 1, 0, 1, seed)
    out = []
    for ids in tok.encode_documents([f.read_text() for f in ds._epoch_files()]):
        out.extend(ids)
    return out


def _take(ds, n):
    it = iter(ds)
    return [next(it) for _ in range(n)]


def test_builtin_tokenizer_and_corpus(tok):
    assert tok.vocab_size == 512
    assert (tok.bos_id, tok.eos_id) == (0, 1)
    text = "Pack the windows, then shard them: 42 tokens.\n\tdef f(x): return x"
    ids = tok.encode_documents([text])[0]
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert tok.decode(ids[1:-1]) == text
    files = list_files(BUILTIN_DATASETS["titanlite_corpus"])
    assert len(files) >= 40 and sum(f.stat().st_size for f in files) > 150_000


def test_special_token_text_is_not_special(tok):
    ids = tok.encode_documents(["a <|end_of_text|> b"])[0]
    assert ids.count(tok.eos_id) == 1 and ids[-1] == tok.eos_id


def test_windows_tile_the_stream_and_ranks_never_overlap(tok):
    files = list_files(BUILTIN_DATASETS["titanlite_corpus"])[:6]
    stream = _stream(tok, files)
    seq, local, dp = 32, 3, 4
    n_windows = len(stream) // (seq + 1)
    per_rank = [
        [
            (x.tolist(), y.tolist())
            for x, y in _take(PackedTextDataset(files, tok, seq, local, r, dp, 0), n_windows // dp)
        ]
        for r in range(dp)
    ]
    # Reassemble the global order: window g belongs to rank (g // local) % dp.
    cursors, seen = [0] * dp, []
    for g in range(n_windows // dp):
        r = (g // local) % dp
        x, y = per_rank[r][cursors[r]]
        cursors[r] += 1
        assert y[:-1] == x[1:]  # labels are the inputs shifted by one
        seen.append(x + [y[-1]])
    flat = [t for w in seen for t in w]
    assert flat == stream[: len(flat)]  # no token lost, none repeated, order kept


def test_epochs_repeat_without_end_and_reshuffle(tok, tmp_path):
    for i in range(3):
        (tmp_path / f"d{i}.txt").write_text(f"document number {i} " * 5)
    files = list_files(tmp_path)
    ds = PackedTextDataset(files, tok, 16, 2, 0, 1, 0)
    windows = _take(ds, 50)
    assert ds.epoch >= 3 and len(windows) == 50
    orders = {tuple(p.name for p in PackedTextDataset(files, tok, 16, 2, 0, 1, 0)._epoch_files())}
    for e in range(1, 6):
        d = PackedTextDataset(files, tok, 16, 2, 0, 1, 0)
        d.epoch = e
        orders.add(tuple(p.name for p in d._epoch_files()))
    assert len(orders) > 1  # the file order changes between epochs


@pytest.fixture(scope="module")
def hf_saved(tmp_path_factory):
    """The corpus's paragraphs as a Hugging Face dataset saved by `datasets` (3 arrow files)."""
    return save_hf_dataset(tmp_path_factory.mktemp("hf") / "saved", corpus_paragraphs())


@pytest.mark.parametrize("source", ["files", "hf_saved"])
@pytest.mark.parametrize("windows", [37, 36])  # inside a micro-batch, between micro-batches
def test_state_dict_resumes_exactly(tok, windows, source, request):
    path = (
        BUILTIN_DATASETS["titanlite_corpus"]
        if source == "files"
        else request.getfixturevalue(source)
    )
    files = list_files(path)
    a = PackedTextDataset(files, tok, 64, 2, 1, 2, 7)
    it = iter(a)
    for _ in range(windows):
        next(it)
    state = a.state_dict()
    expected = [next(it) for _ in range(25)]
    b = PackedTextDataset(files, tok, 64, 2, 1, 2, 7)
    b.load_state_dict(state)
    got = _take(b, 25)
    assert all((x.equal(u) and y.equal(v)) for (x, y), (u, v) in zip(expected, got))


def test_jsonl_malformed_lines_are_skipped_and_reported(tok, tmp_path, caplog):
    lines = [
        json.dumps({"text": "good one"}),
        "{not json",
        json.dumps({"body": "no text"}),
        json.dumps({"text": 5}),
        "",
        json.dumps({"text": "good two"}),
    ]
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    ds = PackedTextDataset(list_files(tmp_path), tok, 4, 1, 0, 1, 0)
    _take(ds, 3)
    assert ds.skipped.count >= 3
    assert ds.skipped.examples[0].startswith(f"{tmp_path / 'd.jsonl'}:2")
    assert any("no 'text' field" in e for e in ds.skipped.examples)


def test_custom_text_field(tok, tmp_path):
    (tmp_path / "d.jsonl").write_text(json.dumps({"content": "hello world"}) + "\n")
    ds = PackedTextDataset(list_files(tmp_path), tok, 4, 1, 0, 1, 0, text_field="content")
    x, _ = _take(ds, 1)[0]
    assert x[0].item() == tok.bos_id and ds.skipped.count == 0


def test_dataset_errors(tok, tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        list_files(tmp_path / "missing")
    (tmp_path / "notes.csv").write_text("a,b")
    with pytest.raises(DatasetError, match="holds no"):
        list_files(tmp_path)
    (tmp_path / "bad.jsonl").write_text("{broken\n{also broken\n")
    ds = PackedTextDataset(list_files(tmp_path), tok, 4, 1, 0, 1, 0)
    with pytest.raises(DatasetError, match="no readable document"):
        _take(ds, 1)


def test_tokenizer_errors(tmp_path):
    with pytest.raises(TokenizerError, match="does not exist"):
        resolve_tokenizer_path(str(tmp_path / "nope.json"))
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(TokenizerError, match="cannot read"):
        Tokenizer(resolve_tokenizer_path(str(tmp_path)))


def test_tokenizer_training_is_deterministic(tmp_path):
    import subprocess
    import sys

    from helpers import ROOT

    out = tmp_path / "tokenizer.json"
    subprocess.run(
        [sys.executable, "scripts/train_tokenizer.py", "--output", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    assert out.read_bytes() == BUILTIN_TOKENIZER.read_bytes()


@pytest.mark.parametrize(
    "lengths, parts",
    [([5, 1, 1, 1, 9, 3, 3, 2], 4), ([100], 4), ([], 2), ([1, 1], 8), ([3] * 64, 64), ([0, 0], 2)],
)
def test_split_by_chars_gives_contiguous_parts_of_about_equal_text(lengths, parts):
    bounds = split_by_chars(lengths, parts)
    assert len(bounds) == parts + 1 and bounds[0] == 0 and bounds[-1] == len(lengths)
    assert bounds == sorted(bounds)
    sizes = [sum(lengths[a:b]) for a, b in zip(bounds, bounds[1:])]
    # Each part overshoots its equal share by less than one document.
    longest_doc = max(lengths, default=0)
    assert max(sizes, default=0) <= sum(lengths) / parts + longest_doc
