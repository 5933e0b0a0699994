"""What the data path costs: shard preparation against the tokenizer alone, and the shard reader
against what training consumes.

  (a) prepare tokens/s per core: `titanlite.data.prepare.prepare(workers=1)` end to end (list and
      plan the files, read, tokenize with Tokenizer.encode_documents, convert to uint16, CRC32,
      write shards, index and manifest) against `tokenizers.Tokenizer.encode_batch` alone on the
      same documents (texts already in memory, nothing written). Both run in this process with
      one tokenizer thread (RAYON_NUM_THREADS=1, set before tokenizers starts its pool), in
      alternating rounds; prepare / tokenizers is the overhead figure (1.0 = none), given as the
      ratio of the medians, of the fastest rounds, the median of the paired rounds' ratios, and
      by CPU time.
  (b) shard reader tokens/s: the trainer's loader (build_dataloader -> StatefulDataLoader over
      ShardWindowDataset) at the debug config's shape (local batch 8, seq 256), iterated alone,
      against the debug model's training tokens/s (`tps`) from a short real run.
  (c) data_loading_pct of that real run (python -m titanlite.train, 1 process, debug config,
      training.dataset_path = the prepared bundled corpus).

    python scripts/data_benchmark.py [--copies 30] [--rounds 3] [--train-steps 20] [--json out.json]
"""

from __future__ import annotations

import os

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # before tokenizers is imported anywhere

import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from titanlite.core.arguments import ArgumentParser, int_arg  # noqa: E402

CORPUS = ROOT / "titanlite" / "assets" / "corpus"


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def make_corpus(folder: Path, copies: int) -> Path:
    """The bundled corpus `copies` times (distinct file names), about 0.2 MB a copy."""
    src = folder / "text"
    for c in range(copies):
        for f in sorted(CORPUS.iterdir()):
            if f.suffix in (".txt", ".py"):
                (src / f"{c:03d}").mkdir(parents=True, exist_ok=True)
                shutil.copy(f, src / f"{c:03d}" / f.name)
    return src


def bench_prepare(work: Path, copies: int, rounds: int) -> dict:
    from tokenizers import Tokenizer as HFTokenizer

    from titanlite.data import list_files
    from titanlite.data.prepare import prepare
    from titanlite.data.text_dataset import read_stream  # noqa: F401  (same import cost both sides)
    from titanlite.data.tokenizer import BUILTIN_TOKENIZER

    src = make_corpus(work, copies)
    texts = [f.read_text() for f in list_files(src)]
    hf = HFTokenizer.from_file(str(BUILTIN_TOKENIZER))
    hf.encode_special_tokens = True
    base, ours, base_cpu, ours_cpu = [], [], [], []
    tokens = 0
    for r in range(rounds):
        for side in ("base", "ours") if r % 2 == 0 else ("ours", "base"):
            out = work / f"shards_{r}"
            c0, t0 = cpu_seconds(), time.perf_counter()
            if side == "base":
                n = sum(len(e) for e in hf.encode_batch(texts, add_special_tokens=False))
            else:
                n = prepare([src], out, workers=1, quiet=True)["tokens"]
            wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
            (base if side == "base" else ours).append(n / wall)
            (base_cpu if side == "base" else ours_cpu).append(n / cpu)
            if side == "ours":
                tokens = n
                shutil.rmtree(out)
        print(
            f"  round {r + 1}: tokenizers {base[-1]:,.0f} tok/s, prepare {ours[-1]:,.0f} tok/s",
            file=sys.stderr,
        )
    b, o = statistics.median(base), statistics.median(ours)
    # On shared cores each side's fastest round is its least disturbed one; the paired ratios
    # show how far the noise reaches.
    return {
        "text_mb": sum(map(len, texts)) / 2**20,
        "documents": len(texts),
        "tokens": tokens,
        "tokenizers_tok_s": b,
        "prepare_tok_s_per_core": o,
        "ratio": o / b,
        "ratio_best": max(ours) / max(base),
        "ratio_paired_median": statistics.median(x / y for x, y in zip(ours, base)),
        "ratio_cpu_time": statistics.median(ours_cpu) / statistics.median(base_cpu),
        "rounds": {"tokenizers": base, "prepare": ours},
    }


def bench_reader(shards_dir: Path, batches: int, seq_len: int = 256, lbs: int = 8) -> dict:
    from titanlite.data import ShardSet, Tokenizer, build_dataloader
    from titanlite.data.tokenizer import BUILTIN_TOKENIZER

    loader = build_dataloader(
        ShardSet(shards_dir),
        Tokenizer(BUILTIN_TOKENIZER),
        seq_len=seq_len,
        local_batch_size=lbs,
        dp_rank=0,
        dp_size=1,
        seed=0,
    )
    it = iter(loader)
    next(it)
    t0 = time.perf_counter()
    for _ in range(batches):
        next(it)
    wall = time.perf_counter() - t0
    return {
        "batches": batches,
        "seq_len": seq_len,
        "local_batch_size": lbs,
        "tok_s": batches * lbs * seq_len / wall,
        "ms_per_batch": 1e3 * wall / batches,
    }


def bench_training(shards_dir: Path, work: Path, steps: int) -> dict:
    folder = work / "run"
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(os.cpu_count()))}
    cmd = [
        sys.executable,
        "-m",
        "titanlite.train",
        "--config",
        str(ROOT / "train_configs" / "debug_model.toml"),
        "--eval.enabled",
        "false",
        "--training.dataset_path",
        str(shards_dir),
        "--training.steps",
        str(steps),
        "--metrics.enable_tensorboard",
        "false",
        "--metrics.log_freq",
        "1",
        "--job.dump_folder",
        str(folder),
    ]
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True)
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()][1:]
    pct = [r["data_loading_pct"] for r in records]
    return {
        "steps": steps,
        "threads": env["OMP_NUM_THREADS"],
        "tps_median": statistics.median(r["tps"] for r in records),
        "data_loading_pct_median": statistics.median(pct),
        "data_loading_pct_max": max(pct),
    }


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--copies",
        type=int_arg(1, 10**6),
        default=30,
        help="copies of the bundled corpus to prepare",
    )
    ap.add_argument("--rounds", type=int_arg(1, 10**9), default=3)
    ap.add_argument("--reader-batches", type=int_arg(1, 10**9), default=2000)
    ap.add_argument("--train-steps", type=int_arg(2, 10**9), default=20)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    from titanlite.data.prepare import prepare

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print("(a) prepare vs tokenizers.encode_batch, 1 thread", file=sys.stderr)
        prep = bench_prepare(work, a.copies, a.rounds)
        shards = work / "corpus_shards"
        prepare([CORPUS], shards, workers=1, quiet=True)
        print("(b) shard reader alone", file=sys.stderr)
        reader = bench_reader(shards, a.reader_batches)
        print("(b, c) debug model training on the shards", file=sys.stderr)
        train = bench_training(shards, work, a.train_steps)
    result = {
        "prepare": prep,
        "reader": reader,
        "training": train,
        "reader_over_training": reader["tok_s"] / train["tps_median"],
        "load_avg": os.getloadavg(),
        "cpus": os.cpu_count(),
    }
    print(f"""
| figure | value |
|---|---|
| text prepared | {prep["text_mb"]:.1f} MiB, {prep["documents"]} documents, {prep["tokens"]:,} tokens |
| tokenizers `encode_batch`, 1 thread (median round) | {prep["tokenizers_tok_s"]:,.0f} tokens/s |
| `prepare`, 1 worker, 1 thread = per core (median round) | {prep["prepare_tok_s_per_core"]:,.0f} tokens/s |
| tokenizers, fastest round; prepare, fastest round | {max(prep["rounds"]["tokenizers"]):,.0f}; {max(prep["rounds"]["prepare"]):,.0f} tokens/s |
| **prepare / tokenizers**: medians; fastest rounds; median of paired rounds; CPU time | **{prep["ratio"]:.3f}**; **{prep["ratio_best"]:.3f}**; {prep["ratio_paired_median"]:.3f}; {prep["ratio_cpu_time"]:.3f} |
| shard reader (loader, batch 8 x seq 256) | {reader["tok_s"]:,.0f} tokens/s ({reader["ms_per_batch"]:.3f} ms/batch) |
| debug model training, 1 process, {train["threads"]} threads | {train["tps_median"]:,.0f} tokens/s (median of steps 2..{train["steps"]}) |
| **reader / training** | **{result["reader_over_training"]:,.0f}x** |
| **data_loading_pct** in that run (median; max) | **{train["data_loading_pct_median"]:.2f}%**; {train["data_loading_pct_max"]:.2f}% |
| load average at the end (1, 5, 15 min) | {", ".join(f"{x:.1f}" for x in result["load_avg"])} |""")
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
