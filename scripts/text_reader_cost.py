"""What the text reader costs each rank as the data-parallel degree grows: tokens tokenized per
rank per step, and the reader's seconds per step, with every rank tokenizing the whole global
stream ("alone", the reader before the tokenizing was shared) and with the ranks sharing it
("shared", `SplitTokenizer` over the run's process group), side by side in one run on real gloo
process groups. Each rank reads `--local-batch` windows of `--seq-len` per step, as in training
with a fixed local batch, so the global batch grows with the degree.

    python scripts/text_reader_cost.py [--degrees 1 2 4] [--steps 300] [--seq-len 256]
        [--local-batch 8] [--project 64] [--json out.json]

The corpus is the bundled one repeated (--copies), so that the stream does not wrap every few
steps. On a machine with fewer cores than ranks the seconds are shared CPU time; the token counts
are exact either way.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Also sets one tokenizer thread per process, as a rank with its cores busy would have.
from data_benchmark import make_corpus  # noqa: E402


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    import torch.distributed as dist

    from titanlite.data import Tokenizer, build_dataloader, list_files
    from titanlite.data.tokenizer import BUILTIN_TOKENIZER

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    result = {}
    for mode in ("alone", "shared"):
        loader = build_dataloader(
            list_files(Path(args.corpus)),
            Tokenizer(BUILTIN_TOKENIZER),
            seq_len=args.seq_len,
            local_batch_size=args.local_batch,
            dp_rank=rank,
            dp_size=world,
            seed=0,
            tokenize_group=dist.group.WORLD if mode == "shared" and world > 1 else None,
        )
        it = iter(loader)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.steps):
            next(it)
        seconds = time.perf_counter() - start
        result[mode] = {
            "tokens_tokenized_per_step": loader.dataset.encoder.tokens_tokenized / args.steps,
            "seconds_per_step": seconds / args.steps,
        }
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def measure(world: int, args: argparse.Namespace) -> dict:
    import torch.multiprocessing as mp

    sys.path.insert(0, str(ROOT / "tests"))
    from helpers import free_port

    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(
            _rank, args=(world, free_port(), args, out), nprocs=world, start_method="spawn"
        )
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]
    return {
        mode: {
            key: statistics.mean(r[mode][key] for r in ranks)
            for key in ("tokens_tokenized_per_step", "seconds_per_step")
        }
        for mode in ("alone", "shared")
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--degrees", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--local-batch", type=int, default=8)
    p.add_argument("--copies", type=int, default=20)
    p.add_argument("--project", type=int, default=64, help="degree to project to")
    p.add_argument("--json")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        args.corpus = str(make_corpus(Path(tmp), args.copies))
        rows = {w: measure(w, args) for w in args.degrees}
    share = args.local_batch * (args.seq_len + 1)
    print(f"own share: {share:,} tokens per rank per step (local batch x (seq_len + 1))")
    print(
        "degree | tokenized/rank/step alone | shared | alone/share | shared/share | s/step alone | shared"
    )
    for w, r in rows.items():
        a, s = r["alone"], r["shared"]
        print(
            f"{w:6d} | {a['tokens_tokenized_per_step']:25,.0f} | {s['tokens_tokenized_per_step']:6,.0f}"
            f" | {a['tokens_tokenized_per_step'] / share:11.2f} | {s['tokens_tokenized_per_step'] / share:12.2f}"
            f" | {a['seconds_per_step']:12.4f} | {s['seconds_per_step']:.4f}"
        )
    # Projection: alone tokenizes the global stream (degree x share); shared, its share (the
    # measured ratio to the share at the largest degree carries over).
    top = rows[max(rows)]["shared"]["tokens_tokenized_per_step"] / share
    print(
        f"projected at degree {args.project}: alone {args.project * share:,} tokens per rank per "
        f"step, shared {top * share:,.0f} (x{top:.2f} the share); at seq 8192, local batch 1: "
        f"alone {args.project * 8193:,}, shared {top * 8193:,.0f}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({str(k): v for k, v in rows.items()}, indent=1))


if __name__ == "__main__":
    main()
