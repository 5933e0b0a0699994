"""Tokenize a corpus once into prepared shards (format: shards.py), in parallel processes.

    python -m titanlite.data.prepare CORPUS... --output DIR [--tokenizer PATH] [--workers N]
    python -m titanlite.data.prepare --hf-dataset NAME [--hf-config C] [--hf-split S]
        [--hf-data-files F...] [--hf-streaming] --output DIR
    python -m titanlite.data.prepare --verify DIR     # check a prepared dataset's checksums

CORPUS: files or folders of .txt/.py (a file is a document), .jsonl (a line is a document) and
.parquet (a row is a document), read by the same code as the on-the-fly reader and tokenized by
the same `Tokenizer.encode_documents`, so the shards hold exactly its token stream (files in
sorted order). The input is planned into pieces of about --shard-mb of text, one shard each;
a piece depends only on the input files, so a rerun skips the shards already finished (their
.json record matches the piece) and redoes the rest. Shards made with another tokenizer are
never mixed in: the tool refuses the folder.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing as mp
import os
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from titanlite.core.arguments import ArgumentParser, float_arg, int_arg
from titanlite.core.errors import report
from titanlite.core.io import atomic_write_text, atomic_writer, file_crc32
from titanlite.data.documents import DatasetError, SkippedRecords, list_files
from titanlite.data.segments import (
    HFSource,
    Segment,
    plan_files,
    plan_hf,
    read_segment,
    segment_record,
)
from titanlite.data.shards import FORMAT, MANIFEST, VERSION, ShardSet, dtype_for
from titanlite.data.tokenizer import Tokenizer, TokenizerError, resolve_tokenizer_path

_ENCODE_CHARS = 1 << 20  # text per encode_documents call


# ----------------------------------------------------------------------------------------------
# tokenizing one piece (in a worker process)


_worker: dict[str, Any] = {}


def _init_worker(tokenizer_path: str, progress: Any, single_thread: bool) -> None:
    if single_thread:
        # Parallelism comes from the processes: one tokenizer thread each, no oversubscription.
        os.environ["RAYON_NUM_THREADS"] = "1"
    _worker.update(tokenizer=Tokenizer(tokenizer_path), progress=progress)


def tokenize_piece(index: int, piece: list[Segment], out: str, text_field: str, dtype: str) -> dict:
    """Write shard `index` from `piece`; return its manifest entry (also written as .json)."""
    tok: Tokenizer = _worker["tokenizer"]
    name, out_dir, skipped = f"shard_{index:05d}", Path(out), SkippedRecords()
    entry: dict[str, Any] = {
        "name": name,
        "tokens": 0,
        "documents": 0,
        "max_id": 0,
        "eos_count": 0,
        "bin_crc32": 0,
        "idx_crc32": 0,
    }
    offsets = [0]
    dt = np.dtype(dtype).newbyteorder("<")
    texts = (t for seg in piece for t in read_segment(seg, text_field, skipped))
    with atomic_writer(out_dir / f"{name}.bin") as fb:
        while batch := list(_take_chars(texts, _ENCODE_CHARS)):
            docs = tok.encode_documents(batch)
            n = sum(map(len, docs))
            ids = np.fromiter(itertools.chain.from_iterable(docs), dtype=dt, count=n)
            for d in docs:
                offsets.append(offsets[-1] + len(d))
            fb.write(ids.data)
            entry["bin_crc32"] = zlib.crc32(ids.data, entry["bin_crc32"])
            entry["max_id"] = max(entry["max_id"], int(ids.max()))
            entry["eos_count"] += int(np.count_nonzero(ids == tok.eos_id))
            entry["tokens"] += n
            entry["documents"] += len(docs)
            if _worker["progress"] is not None:
                _worker["progress"].put((sum(map(len, batch)), n))
    idx = np.asarray(offsets, dtype="<u8")
    with atomic_writer(out_dir / f"{name}.idx") as fi:
        fi.write(idx.data)
    entry["idx_crc32"] = zlib.crc32(idx.data)
    entry.update(
        source=[segment_record(s) for s in piece],
        text_field=text_field,
        tokenizer=tok.fingerprint,
        skipped=skipped.count,
        skipped_examples=skipped.examples,
    )
    _write_json(out_dir / f"{name}.json", entry)  # last: the shard is complete
    return entry


def _take_chars(texts, limit: int):
    size = 0
    for t in texts:
        yield t
        size += len(t)
        if size >= limit:
            return


# ----------------------------------------------------------------------------------------------
# the driver


def _write_json(path: Path, obj: Any, indent: int | None = None) -> None:
    atomic_write_text(path, json.dumps(obj, indent=indent))


def _finished(
    out: Path, index: int, piece: list[Segment], text_field: str, fingerprint: str, itemsize: int
) -> tuple[dict | None, str | None]:
    """(the shard's entry, None) if an earlier run completed it from this same piece and its
    files still match the record; else (None, what is wrong, or None if it was never made)."""
    name = f"shard_{index:05d}"
    try:
        entry = json.loads((out / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None, None
    same = (
        entry.get("source") == [segment_record(s) for s in piece]
        and entry.get("text_field") == text_field
        and entry.get("tokenizer") == fingerprint
    )
    if not same:
        return None, None
    # The record is only a claim: a shard truncated, bit-flipped or deleted since must be made
    # again, as every shard error message promises.
    for ext, size, crc in (
        ("bin", entry["tokens"] * itemsize, entry["bin_crc32"]),
        ("idx", (entry["documents"] + 1) * 8, entry["idx_crc32"]),
    ):
        f = out / f"{name}.{ext}"
        if not f.is_file():
            return None, f"{f} is missing"
        if f.stat().st_size != size:
            return None, f"{f} has {f.stat().st_size} bytes, its record says {size}"
        if file_crc32(f) != crc:
            return None, f"{f} does not match its recorded CRC32"
    return entry, None


def _refuse_other_tokenizer(out: Path, tok: Tokenizer) -> None:
    for record in sorted(out.glob("shard_*.json"))[:1] + [out / MANIFEST]:
        if record.is_file():
            fp = json.loads(record.read_text()).get("tokenizer")
            fp = fp.get("fingerprint") if isinstance(fp, dict) else fp
            if fp != tok.fingerprint:
                raise DatasetError(
                    f"--output {out} holds shards made with another tokenizer (fingerprint {fp}, "
                    f"this one is {tok.fingerprint}): choose another --output, or delete it"
                )


class Progress:
    """One status line on stderr: text read, tokens, tokens/s and the ETA (by text read)."""

    def __init__(self, total_bytes: int):
        self.total, self.done, self.tokens = max(1, total_bytes), 0, 0
        self.start = self.last = time.perf_counter()
        self.tty = sys.stderr.isatty()

    def add(self, nbytes: int, ntokens: int, force: bool = False) -> None:
        self.done, self.tokens = self.done + nbytes, self.tokens + ntokens
        now = time.perf_counter()
        if not force and now - self.last < (0.5 if self.tty else 10):
            return
        self.last = now
        rate = self.tokens / max(now - self.start, 1e-9)
        eta = (now - self.start) * (self.total - self.done) / max(self.done, 1)
        line = (
            f"prepare: {min(100, 100 * self.done / self.total):5.1f}%  {self.tokens:,} tokens  "
            f"{rate:,.0f} tokens/s  ETA {time.strftime('%H:%M:%S', time.gmtime(eta))}"
        )
        print(
            ("\r" if self.tty else "") + line,
            end="" if self.tty else "\n",
            file=sys.stderr,
            flush=True,
        )


def prepare(
    inputs: list[Path],
    output: Path,
    tokenizer_path: str = "",
    workers: int = 1,
    shard_mb: float = 256,
    text_field: str = "text",
    hf: HFSource | None = None,
    quiet: bool = False,
) -> dict:
    """Tokenize `inputs` (or the Hugging Face dataset `hf`) into shards
    under `output`; return the manifest. workers = 1 tokenizes in this process."""
    tok_path = resolve_tokenizer_path(tokenizer_path)
    tok = Tokenizer(tok_path)
    _open_output(output, tok)
    pieces, sources = _plan(inputs, hf, max(1, int(shard_mb * 2**20)), text_field)
    dtype = dtype_for(tok.vocab_size)
    entries, todo = _resume(output, pieces, text_field, tok, dtype, quiet)
    progress = Progress(sum(s.nbytes for i in todo for s in pieces[i])) if not quiet else None
    args = [(i, pieces[i], str(output), text_field, dtype) for i in todo]
    entries.update(_tokenize(args, str(tok_path), workers, progress))
    manifest = _manifest(entries, tok, dtype, text_field, sources)
    if manifest["tokens"] == 0:  # a manifest of no shards would only fail later, in training
        example = manifest["skipped_examples"][:1]
        raise DatasetError(
            f"the input yields no tokens ({manifest['skipped_records']} malformed records"
            + (f", e.g. {example[0]}" if example else "")
            + "); nothing to train on"
        )
    _write_json(output / MANIFEST, manifest, indent=1)
    return manifest


def _open_output(output: Path, tok: Tokenizer) -> None:
    """The --output folder, created if need be, holding no shards of another tokenizer."""
    if output.exists() and not output.is_dir():
        raise DatasetError(f"--output {output} is an existing file; give a folder")
    try:
        output.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DatasetError(f"--output {output}: cannot create it ({e.strerror or e})") from None
    _refuse_other_tokenizer(output, tok)


def _plan(
    inputs: list[Path], hf: HFSource | None, target: int, text_field: str
) -> tuple[list[list[Segment]], list[str]]:
    """The pieces of about `target` bytes of text, one shard each, and the sources' names."""
    if hf is not None:
        return plan_hf(hf, target, text_field), [f"hf:{hf.name}"]
    files = [f for p in inputs for f in list_files(p, key="prepare input")]
    return plan_files(files, target), [str(p) for p in inputs]


def _resume(
    output: Path,
    pieces: list[list[Segment]],
    text_field: str,
    tok: Tokenizer,
    dtype: str,
    quiet: bool,
) -> tuple[dict[int, dict], list[int]]:
    """The entries of the shards an earlier run finished from these same pieces, and the
    indices of the pieces still to tokenize; shards beyond this plan's end are removed."""
    entries: dict[int, dict] = {}
    todo = []
    itemsize = np.dtype(dtype).itemsize
    for i, piece in enumerate(pieces):
        done, damage = _finished(output, i, piece, text_field, tok.fingerprint, itemsize)
        if done is not None:
            entries[i] = done
        else:
            todo.append(i)
            if damage and not quiet:
                print(f"prepare: {damage}; making that shard again", file=sys.stderr)
    for stale in output.glob("shard_*"):  # shards of an earlier plan beyond this one's end
        if int(stale.name[6:11]) >= len(pieces):
            stale.unlink()
    if entries and not quiet:
        print(
            f"prepare: {len(entries)} of {len(pieces)} shards already done, skipped",
            file=sys.stderr,
        )
    return entries, todo


def _tokenize(
    args: list[tuple], tok_path: str, workers: int, progress: Progress | None
) -> dict[int, dict]:
    """Run tokenize_piece on each of `args`: in this process, or in a pool of `workers`."""
    entries: dict[int, dict] = {}
    if workers <= 1 or len(args) <= 1:
        queue = _Inline(progress)
        _init_worker(tok_path, queue, single_thread=False)
        for a in args:
            entries[a[0]] = tokenize_piece(*a)
    else:
        entries.update(_run_pool(args, tok_path, workers, progress))
    if progress is not None and args:
        progress.add(0, 0, force=True)
        if progress.tty:
            print(file=sys.stderr)
    return entries


class _Inline:
    """The progress queue's interface when tokenizing in this process."""

    def __init__(self, progress: Progress | None):
        self.progress = progress

    def put(self, item: tuple[int, int]) -> None:
        if self.progress is not None:
            self.progress.add(*item)


def _run_pool(
    args: list[tuple], tok_path: str, workers: int, progress: Progress | None
) -> dict[int, dict]:
    ctx = mp.get_context("spawn")  # fork would copy the tokenizer's Rust thread pool state
    queue = ctx.Queue()
    with ctx.Pool(min(workers, len(args)), _init_worker, (tok_path, queue, True)) as pool:
        pending = [pool.apply_async(tokenize_piece, a) for a in args]
        while not all(p.ready() for p in pending):
            _drain(queue, progress, timeout=0.2)
        _drain(queue, progress, timeout=0)
        return {a[0]: p.get() for a, p in zip(args, pending)}


def _drain(queue: Any, progress: Progress | None, timeout: float) -> None:
    import queue as queue_lib

    try:
        while True:
            item = queue.get(timeout=timeout)
            if progress is not None:
                progress.add(*item)
    except queue_lib.Empty:
        return


def _manifest(
    entries: dict[int, dict], tok: Tokenizer, dtype: str, text_field: str, sources: list[str]
) -> dict:
    ordered = [entries[i] for i in sorted(entries)]
    # The pieces' sources stay in the shards' own records: with many small files they would
    # make the manifest, which every rank reads, large.
    shards = [
        {k: v for k, v in e.items() if k not in ("skipped_examples", "tokenizer", "source")}
        for e in ordered
        if e["tokens"] > 0
    ]  # a piece of only malformed records: no shard
    return {
        "format": FORMAT,
        "version": VERSION,
        "dtype": dtype,
        "text_field": text_field,
        "tokenizer": {
            "fingerprint": tok.fingerprint,
            "path": str(tok.path),
            "vocab_size": tok.vocab_size,
            "bos_id": tok.bos_id,
            "eos_id": tok.eos_id,
        },
        "sources": sources,
        "tokens": sum(s["tokens"] for s in shards),
        "documents": sum(s["documents"] for s in shards),
        "skipped_records": sum(e["skipped"] for e in ordered),
        "skipped_examples": [x for e in ordered for x in e["skipped_examples"]][:5],
        "shards": shards,
    }


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="prepare_data", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "inputs", nargs="*", type=Path, help=".txt/.py/.jsonl/.parquet files or folders"
    )
    ap.add_argument("--output", type=Path, help="folder for the shards and manifest")
    ap.add_argument("--tokenizer", default="", help="tokenizer.json (or folder); '' = built-in")
    ap.add_argument(
        "--workers", type=int_arg(1, 4096), default=os.cpu_count() or 1, help="processes"
    )
    ap.add_argument(
        "--shard-mb", type=float_arg(0, 2**20, above=True), default=256, help="text per shard, MiB"
    )
    ap.add_argument("--text-field", default="text", help="text field of .jsonl/.parquet records")
    ap.add_argument(
        "--hf-dataset",
        help="a Hugging Face dataset: a hub name, a local folder of data files, a builder "
        "(json, parquet, csv, text) with --hf-data-files, or a save_to_disk folder (needs "
        "`datasets`: pip install 'titanlite[hf]')",
    )
    ap.add_argument("--hf-config", default=None, help="the dataset's configuration (subset)")
    ap.add_argument("--hf-split", default="train")
    ap.add_argument("--hf-data-files", nargs="+", default=[], help="files for a builder")
    ap.add_argument(
        "--hf-streaming",
        action="store_true",
        help="read it streamed, without downloading and converting it first (one shard per "
        "data file of the dataset)",
    )
    ap.add_argument(
        "--verify", type=Path, help="check the checksums of a prepared dataset, and exit"
    )
    a = ap.parse_args(argv)
    if a.verify:
        return verify(a.verify)
    if a.output is None:
        ap.error("--output is required")
    if bool(a.inputs) == bool(a.hf_dataset):
        ap.error("give input files/folders or --hf-dataset (one of them)")
    start = time.perf_counter()
    try:
        m = prepare(
            a.inputs,
            a.output,
            a.tokenizer,
            a.workers,
            a.shard_mb,
            a.text_field,
            HFSource(a.hf_dataset, a.hf_config, a.hf_split, tuple(a.hf_data_files), a.hf_streaming)
            if a.hf_dataset
            else None,
        )
    except (DatasetError, TokenizerError) as e:
        return report(e, prog="prepare")
    took = time.perf_counter() - start
    print(
        f"prepare: {m['tokens']:,} tokens, {m['documents']:,} documents in {len(m['shards'])} "
        f"{m['dtype']} shards at {a.output / MANIFEST} ({took:.1f}s; {m['skipped_records']} "
        "malformed records skipped)"
    )
    return 0


def verify(path: Path) -> int:
    try:
        shards = ShardSet(path, key="--verify")
    except DatasetError as e:
        return report(e, prog="prepare")
    problems = shards.verify_checksums()
    for p in problems:
        print(f"  - {p}")
    m = shards.manifest
    print(
        f"{shards.manifest_file}: {f'{len(problems)} problem(s)' if problems else 'OK'} "
        f"({len(shards.shards)} shards, {shards.total_tokens:,} {m['dtype']} tokens, "
        f"{m['documents']:,} documents, tokenizer {m['tokenizer']['fingerprint']})"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
