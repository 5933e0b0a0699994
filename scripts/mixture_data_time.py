"""What a data mixture's sources cost the loader: data time per step (the trainer's "data" span,
one `next()` of its loader) at the debug config's shape (local batch 8, seq 256, one rank), for
the bundled corpus prepared as ONE source against the same corpus split into 8 sources of equal
weight. Both read prepared shards through `build_dataloader`, as training does; choosing a
window's source is O(1) (titanlite/data/mixture_schedule.py), so 8 sources should cost what 1
does.

The two loaders are timed in alternating rounds in one process (this machine is noisy); each
round times `steps` steps after a warm-up step. The figures: each variant's fastest round and
median round (seconds per step), and 8 / 1 for both.

    python scripts/mixture_data_time.py [--rounds 5] [--steps 100] [--json out.json]
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from titanlite.core.arguments import ArgumentParser, int_arg  # noqa: E402

CORPUS = ROOT / "titanlite" / "assets" / "corpus"
SEQ_LEN, LOCAL_BATCH = 256, 8  # the debug config's shape


def prepare_sources(work: Path, count: int) -> list[Path]:
    """The bundled corpus's files dealt round-robin into `count` prepared sources."""
    from titanlite.data.prepare import prepare

    files = sorted(f for f in CORPUS.iterdir() if f.suffix in (".txt", ".py"))
    folders = []
    for s in range(count):
        folder = work / f"{count}_sources" / f"source_{s}"
        prepare(files[s::count], folder, shard_mb=0.05, quiet=True)
        folders.append(folder)
    return folders


def loader(folders: list[Path]):
    from titanlite.data import ShardSet, Tokenizer, build_dataloader, resolve_tokenizer_path
    from titanlite.data.mixture import Mixture

    sources = [ShardSet(f, f"data.sources.s{i}.path") for i, f in enumerate(folders)]
    names = [f"s{i}" for i in range(len(folders))]
    weights = [1.0] * len(folders)
    mixture = Mixture(names, sources, [(1, weights)], [1e9] * len(folders))
    tokenizer = Tokenizer(resolve_tokenizer_path(""))  # prepared shards: not used
    return build_dataloader(
        mixture,
        tokenizer,
        seq_len=SEQ_LEN,
        local_batch_size=LOCAL_BATCH,
        dp_rank=0,
        dp_size=1,
        seed=0,
        windows_per_step=LOCAL_BATCH,
    )


def time_steps(iterator, steps: int) -> float:
    """Seconds per step of `steps` batches (the collector off: its pauses land on either)."""
    next(iterator)  # warm-up: the first batch maps the shards
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(steps):
            next(iterator)
        return (time.perf_counter() - start) / steps
    finally:
        gc.enable()


def measure(work: Path, rounds: int = 5, steps: int = 100) -> dict:
    variants = {n: prepare_sources(work, n) for n in (1, 8)}
    times: dict[int, list[float]] = {1: [], 8: []}
    for _ in range(rounds):
        for n, folders in variants.items():
            times[n].append(time_steps(iter(loader(folders)), steps))
    result: dict = {"rounds": rounds, "steps": steps, "seq_len": SEQ_LEN, "batch": LOCAL_BATCH}
    for n, t in times.items():
        result[f"{n}_sources"] = {"fastest_s": min(t), "median_s": statistics.median(t)}
    result["ratio_fastest"] = min(times[8]) / min(times[1])
    result["ratio_median"] = statistics.median(times[8]) / statistics.median(times[1])
    return result


def main() -> None:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int_arg(1, 10**9), default=5)
    parser.add_argument("--steps", type=int_arg(1, 10**9), default=100)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        result = measure(Path(work), args.rounds, args.steps)
    for n in (1, 8):
        r = result[f"{n}_sources"]
        print(
            f"{n} source(s): {r['fastest_s'] * 1e3:.3f} ms/step fastest, "
            f"{r['median_s'] * 1e3:.3f} ms/step median"
        )
    print(
        f"8 / 1 sources: {result['ratio_fastest']:.3f} (fastest), "
        f"{result['ratio_median']:.3f} (median)"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
