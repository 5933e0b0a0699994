"""Forward + backward tokens/s of document masking (block_causal) against plain causal attention,
side by side in one process.

CPU (default): the debug model as the trainer builds it (preflight's model arguments, the
family's model on meta, to_empty + init_weights), float32: SDPA causal, SDPA block_causal (a
dense mask) and varlen block_causal (the default: attention per document).
`--device cuda`: a Llama-3-8B-shaped stack (dim 4096, 32 heads, 8 KV heads, FFN 14336;
`--layers` blocks, default 2), bf16 weights, seq 8192: the same three and compiled FlexAttention
block_causal, each with its peak allocated memory; a variant that runs out of memory is reported
as such.

The windows are real ones: the bundled corpus framed BOS ... EOS and packed into windows of
seq + 1 tokens as the text reader packs it (its files are 1,900-3,300-token documents;
`--paragraphs` makes each paragraph a document instead, for many boundaries per window). The
variants are timed in interleaved rounds (A B C, B C A, ...), on the same weights and batches;
the table gives the median tokens/s of each and its ratio to SDPA causal, plus the median of
the per-round ratios, which a machine whose load changes between rounds moves less.

    python scripts/bench_attention.py --quick                 # CPU, a few seconds
    python scripts/bench_attention.py --rounds 7 --threads 1  # CPU, the figures in docs
    python scripts/bench_attention.py --device cuda           # GPU (scripts/bench_gpu.sh)
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
# Run as a file, this process has scripts/ on its path, not the checkout it belongs to.
sys.path.insert(0, str(ROOT))
from models.llama import FLAVORS, LlamaArgs  # noqa: E402
from titanlite.components.loss import cross_entropy_sum, ignore_boundary_targets  # noqa: E402
from titanlite.config.loader import load  # noqa: E402
from titanlite.core.arguments import ArgumentParser, int_arg  # noqa: E402
from titanlite.data import Tokenizer, resolve_tokenizer_path  # noqa: E402
from titanlite.families import get_family, model_args  # noqa: E402

DEBUG_TOML = ROOT / "train_configs" / "debug_model.toml"
CORPUS = ROOT / "titanlite" / "assets" / "corpus"
# name -> (attn_type, attn_mask_type); the first is the reference of the ratios.
VARIANTS = {
    "sdpa causal": ("sdpa", "causal"),
    "sdpa block_causal": ("sdpa", "block_causal"),
    "varlen block_causal (auto)": ("varlen", "block_causal"),
    "flex block_causal": ("flex", "block_causal"),
}


def corpus_windows(tokenizer, seq: int, paragraphs: bool) -> torch.Tensor:
    """(windows, seq + 1) token ids of the bundled corpus, in sorted file order."""
    texts = [f.read_text() for f in sorted(CORPUS.glob("*_*.*"))]
    if paragraphs:
        texts = [p for t in texts for p in t.split("\n\n") if p.strip()]
    stream = [i for ids in tokenizer.encode_documents(texts) for i in ids]
    n = len(stream) // (seq + 1)
    if n == 0:
        raise SystemExit(f"bench_attention: the corpus holds fewer than {seq + 1} tokens")
    return torch.tensor(stream[: n * (seq + 1)]).view(n, seq + 1)


def build(args: LlamaArgs, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """As titanlite.build.assemble does for one process: on meta, then to_empty + init_weights."""
    family = get_family("llama3")
    with torch.device("meta"):
        model = family.model.model_cls(args)
    model.to_empty(device=device)
    model.init_weights(0, buffer_device=device)
    for p in model.parameters():  # the weights only: the RoPE table stays complex64
        p.data = p.data.to(dtype)
    return model.train()


def step(model: torch.nn.Module, batch: torch.Tensor, bos_id: int) -> None:
    x, y = batch[:, :-1], batch[:, 1:]
    if model.args.attn_mask_type == "block_causal":
        y = ignore_boundary_targets(y, bos_id)
    cross_entropy_sum(model(x), y).backward()
    model.zero_grad(set_to_none=True)


def setup(opts: argparse.Namespace) -> tuple[LlamaArgs, dict, torch.Tensor, torch.dtype, str]:
    """(model arguments, variants, corpus windows, weight dtype, a description) for the device."""
    tokenizer = Tokenizer(resolve_tokenizer_path(""))
    if opts.device == "cpu":
        job = load(["--config", str(DEBUG_TOML), "--training.seq_len", str(opts.seq or 256)])
        args = model_args(job, tokenizer.vocab_size, tokenizer.bos_id)
        variants = {k: v for k, v in VARIANTS.items() if v[0] != "flex"}  # no CPU flex backward
        dtype, what = torch.float32, "debug model, float32"
    else:
        args = dataclasses.replace(
            FLAVORS["8B"],
            n_layers=opts.layers,
            vocab_size=tokenizer.vocab_size,
            bos_id=tokenizer.bos_id,
            max_seq_len=opts.seq or 8192,
        )
        variants, dtype = VARIANTS, torch.bfloat16
        what = f"Llama-3-8B-shaped, {opts.layers} blocks, bf16 weights"
    windows = corpus_windows(tokenizer, args.max_seq_len, opts.paragraphs)
    return args, variants, windows, dtype, what


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--quick", action="store_true", help="seq 128, batch 2, 2 rounds of 1 step")
    ap.add_argument(
        "--seq", type=int_arg(1, 2**24), default=None, help="default: 256 (CPU), 8192 (CUDA)"
    )
    ap.add_argument(
        "--batch", type=int_arg(1, 2**20), default=None, help="default: 8 (CPU), 1 (CUDA)"
    )
    ap.add_argument("--layers", type=int_arg(1, 2**20), default=2, help="CUDA: 8B-shaped blocks")
    ap.add_argument("--rounds", type=int_arg(1, 10**9), default=5)
    ap.add_argument(
        "--steps", type=int_arg(1, 10**9), default=3, help="timed steps per variant per round"
    )
    ap.add_argument(
        "--threads", type=int_arg(1, 2**16), default=None, help="CPU threads (torch default)"
    )
    ap.add_argument("--paragraphs", action="store_true", help="one document per paragraph")
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    opts = ap.parse_args(argv)
    if opts.quick:
        opts.seq, opts.batch, opts.rounds, opts.steps = opts.seq or 128, opts.batch or 2, 2, 1
    if opts.threads:
        torch.set_num_threads(opts.threads)
    if opts.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_attention: --device cuda but no CUDA device")
    args, variants, windows, dtype, what = setup(opts)
    device = torch.device(opts.device)
    bs = opts.batch or (8 if opts.device == "cpu" else 1)
    windows = windows.to(device)
    batches = [windows[i : i + bs] for i in range(0, len(windows) - bs + 1, bs)]
    boundaries = (windows[:, :-1] == args.bos_id).sum(1).float().mean().item()
    table = run(opts, args, variants, batches, device, dtype)
    threads = f", {torch.get_num_threads()} thread(s)" if opts.device == "cpu" else ""
    header = (
        f"{what}, seq {args.max_seq_len} x batch {bs}, {opts.device}{threads}; "
        f"{boundaries:.2f} BOS per window; medians of {opts.rounds} rounds x {opts.steps} steps"
    )
    text = render(header, table, cpu=opts.device == "cpu")
    print(text)
    if opts.out:
        opts.out.write_text(text + "\n")
    return 0 if all("tps" in r for r in table.values()) else 1


def run(opts, args, variants, batches, device, dtype) -> dict[str, dict]:
    """Warm each variant up once, then time them in rotating order, round after round."""
    models, table = {}, {}
    for name, (attn, mask) in variants.items():
        try:
            models[name] = build(
                dataclasses.replace(args, attn_type=attn, attn_mask_type=mask), device, dtype
            )
            if device.type == "cuda":  # what one step adds to the weights already held
                torch.cuda.reset_peak_memory_stats()
                held = torch.cuda.memory_allocated()
            step(models[name], batches[0], args.bos_id)  # warm-up (compiles flex)
            table[name] = {"times": [], "cpu": []}
            if device.type == "cuda":
                table[name]["peak_gib"] = (torch.cuda.max_memory_allocated() - held) / 2**30
        except torch.OutOfMemoryError:
            models.pop(name, None)
            table[name] = {"error": "out of memory"}
        sync(device)
        r = table[name]
        said = r.get("error") or "warmed up"
        if "peak_gib" in r:
            said += f", step peak {r['peak_gib']:.2f} GiB above the weights"
        print(f"bench_attention: {name}: {said}", flush=True)
    names = list(models)
    for r in range(opts.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            wall, cpu = time.perf_counter(), time.process_time()
            for s in range(opts.steps):
                step(models[name], batches[(r * opts.steps + s) % len(batches)], args.bos_id)
            sync(device)
            table[name]["times"].append(time.perf_counter() - wall)
            table[name]["cpu"].append(time.process_time() - cpu)
        tokens = opts.steps * batches[0].shape[0] * args.max_seq_len
        done = ", ".join(f"{n} {tokens / table[n]['times'][-1]:,.0f}" for n in names)
        print(f"bench_attention: round {r + 1}/{opts.rounds} tokens/s: {done}", flush=True)
    tokens = opts.steps * batches[0].shape[0] * args.max_seq_len
    for name in names:
        table[name]["tps"] = [tokens / t for t in table[name]["times"]]
        table[name]["cpu_tps"] = [tokens / t for t in table[name]["cpu"]]
    return table


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def render(header: str, table: dict[str, dict], cpu: bool) -> str:
    """Wall-clock tokens/s and ratios; on CPU also tokens per second of this process's CPU
    time, which other processes competing for the cores barely move."""
    ref = next(iter(table.values()))
    cols = ["tokens/s (median)", "vs sdpa causal", "per-round ratio (median)"]
    cols += (
        ["tokens per CPU-s (median)", "vs sdpa causal"]
        if cpu
        else ["step peak GiB (above weights)"]
    )
    lines = [
        header,
        "",
        "| variant | " + " | ".join(cols) + " |",
        "|---" + "|---:" * len(cols) + "|",
    ]
    for name, r in table.items():
        if "error" in r:
            lines.append(f"| {name} | {r['error']} |" + " |" * (len(cols) - 1))
            continue
        cells = _figures(r["tps"], ref.get("tps"), paired=True)
        cells += (
            _figures(r["cpu_tps"], ref.get("cpu_tps"), paired=False)
            if cpu
            else [f"{r['peak_gib']:.2f}"]
        )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _figures(values: list[float], ref: list[float] | None, paired: bool) -> list[str]:
    median = statistics.median(values)
    cells = [f"{median:,.0f}", f"{median / statistics.median(ref):.3f}" if ref else "n/a"]
    if paired:
        ratios = [a / b for a, b in zip(values, ref)] if ref else []
        cells.append(f"{statistics.median(ratios):.3f}" if ratios else "n/a")
    return cells


if __name__ == "__main__":
    sys.exit(main())
