"""Hugging Face datasets through the real `datasets` library on local data (the hub is not
reachable here): shards prepared from a `save_to_disk` folder and from the json builder (also
streamed), training's text reader on a saved folder, and the one-line errors."""

import json
import subprocess
import sys

import pytest
from helpers import ROOT, clean_env, corpus_paragraphs, save_hf_dataset

from titanlite.data import DatasetError, PackedTextDataset, ShardSet, Tokenizer, list_files
from titanlite.data.prepare import main as prepare_main
from titanlite.data.prepare import prepare
from titanlite.data.segments import HFSource
from titanlite.data.text_dataset import read_stream
from titanlite.data.tokenizer import BUILTIN_TOKENIZER

ROWS = corpus_paragraphs()


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(BUILTIN_TOKENIZER)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return save_hf_dataset(tmp_path_factory.mktemp("hf") / "saved", ROWS, column="body")


def _stream(tok, rows):
    return [t for ids in tok.encode_documents(rows) for t in ids]


def test_prepare_from_a_saved_dataset_and_rerun(saved, tok, tmp_path, capsys):
    out = tmp_path / "shards"
    args = ["--hf-dataset", str(saved), "--text-field", "body", "--output", str(out)]
    assert prepare_main([*args, "--shard-mb", "0.02", "--workers", "2"]) == 0
    shards = ShardSet(out)
    assert len(shards.shards) > 3 and shards.manifest["documents"] == len(ROWS)
    assert shards.tokens(0, shards.total_tokens).tolist() == _stream(tok, ROWS)
    capsys.readouterr()
    assert prepare_main([*args, "--shard-mb", "0.02", "--workers", "1"]) == 0
    assert f"{len(shards.shards)} of {len(shards.shards)} shards already done" in (
        capsys.readouterr().err
    )


def test_prepare_from_the_json_builder_loaded_and_streamed(tok, tmp_path):
    half = len(ROWS) // 2
    files = []
    for i, part in enumerate((ROWS[:half], ROWS[half:])):
        files.append(tmp_path / f"part{i}.jsonl")
        files[-1].write_text("".join(json.dumps({"text": r, "n": 1}) + "\n" for r in part))
    for streaming in (False, True):
        out = tmp_path / f"streaming_{streaming}"
        src = HFSource("json", data_files=tuple(map(str, files)), streaming=streaming)
        m = prepare([], out, shard_mb=0.05, hf=src, quiet=True)
        assert ShardSet(out).tokens(0, m["tokens"]).tolist() == _stream(tok, ROWS)
        if streaming:  # one shard per data file: a stream's length is unknown before reading
            assert len(m["shards"]) == 2
        record = json.loads((out / "shard_00000.json").read_text())["source"][0]
        assert record["hf_data_files"] == list(map(str, files))
        assert record.get("hf_streaming", False) == streaming


def test_hugging_face_errors_are_one_line(saved, tmp_path, capsys, monkeypatch):
    def error(*args: str) -> str:
        assert prepare_main([*args, "--output", str(tmp_path / "out")]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1, lines
        return lines[0]

    assert "no column 'text' (columns: id, body)" in error("--hf-dataset", str(saved))
    hub = subprocess.run(  # in a fresh process: `datasets` reads HF_HUB_OFFLINE on import
        [sys.executable, "scripts/prepare_data.py", "--hf-dataset", "nobody/no-such-dataset"]
        + ["--output", str(tmp_path / "hub")],
        cwd=ROOT,
        env=clean_env(HF_HUB_OFFLINE="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert hub.returncode == 2 and hub.stderr.strip().splitlines() == [
        "prepare: error: --hf-dataset nobody/no-such-dataset: cannot load it (ConnectionError: "
        "Couldn't reach 'nobody/no-such-dataset' on the Hub (OfflineModeIsEnabled))"
    ]
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    from titanlite.data import segments

    monkeypatch.setattr(segments, "_HF_CACHE", {})
    assert "pip install 'titanlite[hf]'" in error("--hf-dataset", "json")


def test_training_reads_a_saved_dataset_by_its_column(saved, tok, tmp_path):
    files = list_files(saved)
    assert [f.name for f in files] == [f"data-0000{i}-of-00003.arrow" for i in range(3)]
    assert read_stream(files, tok, "body") == _stream(tok, ROWS)
    ds = PackedTextDataset(files, tok, 31, 2, 0, 1, seed=5, text_field="body")
    epoch0 = read_stream(ds._epoch_files(), tok, "body")  # the arrow files, shuffled
    it = iter(ds)
    got = [t for x, y in (next(it) for _ in range(40)) for t in [*x.tolist(), y[-1].item()]]
    assert got == epoch0[: len(got)]
    with pytest.raises(DatasetError, match=r"no column 'text' \(columns: id, body\)"):
        next(iter(PackedTextDataset(files, tok, 31, 2, 0, 1)))
    from datasets import DatasetDict, load_from_disk

    DatasetDict(train=load_from_disk(str(saved))).save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(DatasetError, match=r"DatasetDict \(splits: train\); point it at one"):
        list_files(tmp_path / "dict")
