"""bf16 vs float8 training throughput, with and without torch.compile, side by side in one run.

Each variant is a real `python -m titanlite.train` run (one process) of the same model on the
same data; tokens/s and MFU are the medians of its logged steps after warm-up (MFU against the
dense bf16 peak, the 6N + attention FLOP count, as the trainer logs it). Ratios against
bf16 + compile are what to read: absolute numbers move with the machine's state.

The model is Llama-3-8B-shaped (dim 4096, 32 heads, 8 KV heads, FFN 14336) with as many blocks
as the dry run says fit the device. Data and tokenizer are the bundled ones (no download), so the
vocabulary is 512 and the output head is negligible: the figures are the blocks' throughput.

Weights are float32 (the optimizer's master copy) and the matmuls run in bf16 under autocast:
one GPU has no FSDP to cast the parameters. Each variant's row is printed as soon as it has run.

    python scripts/bench_float8.py --layers 8         # on a GPU; see scripts/bench_gpu.sh
    python scripts/bench_float8.py                    # the most blocks that fit (dry runs first)
    python scripts/bench_float8.py --smoke            # CPU rehearsal: debug model, 3 steps each

Run as a file from a checkout: its root is put on every run's path, nothing needs installing.
Without torchao the float8 variants are left out (the table says so).
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from titanlite.core.arguments import ArgumentParser, float_arg, int_arg  # noqa: E402

TOML_8B = ROOT / "train_configs" / "llama_8b.toml"
DEBUG_TOML = ROOT / "train_configs" / "debug_model.toml"

VARIANTS = {
    "bf16": [],
    "bf16 + compile": ["--training.compile"],
    "float8 tensorwise": ["--model.converters", "float8", "--float8.recipe_name", "tensorwise"],
    "float8 tensorwise + compile": [
        "--model.converters",
        "float8",
        "--float8.recipe_name",
        "tensorwise",
        "--training.compile",
    ],
}
REFERENCE = "bf16 + compile"


def largest_fitting_layers(base: list[str], memory_gib: float, max_layers: int) -> int:
    """The most 8B-shaped blocks whose dry-run plan fits in `memory_gib` on one device."""
    code = (
        "import sys\nfrom titanlite.config.loader import load\nfrom titanlite.planning.dry_run import plan\n"
        "job = load(sys.argv[2:])\n"
        # --memory-gib is already what is left after the headroom.
        "p = plan(job, 1, 0, float(sys.argv[1]), 'cuda', headroom_gib=0)\n"
        "print(int(p.fits))\n"
    )
    for layers in range(max_layers, 0, -1):
        out = subprocess.run(
            [sys.executable, "-c", code, str(memory_gib), *base, "--model.n_layers", str(layers)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        if out.stdout.strip().endswith("1"):
            return layers
    raise SystemExit("bench_float8: not even one block fits; lower --seq-len or --batch")


def run_variant(
    name: str,
    base: list[str],
    extra: list[str],
    steps: int,
    warmup: int,
    folder: Path,
    timeout: float | None = None,
) -> dict:
    dump = folder / name.replace(" ", "_").replace("+", "plus")
    cmd = [
        sys.executable,
        "-m",
        "titanlite.train",
        *base,
        *extra,
        "--job.dump_folder",
        str(dump),
        "--training.steps",
        str(steps),
        "--metrics.log_freq",
        "1",
        "--metrics.enable_tensorboard",
        "false",
        "--checkpoint.enable_checkpoint",
        "false",
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    # The checkout is what runs, installed or not (an offline GPU machine has no pip).
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"variant": name, "error": [f"timed out after {timeout}s"]}
    if proc.returncode != 0:
        return {"variant": name, "error": proc.stderr.strip().splitlines()[-1:]}
    rows = [json.loads(line) for line in (dump / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in rows if r["step"] > warmup]
    mfu = [r["mfu"] for r in timed if r.get("mfu") is not None]
    return {
        "variant": name,
        "tps": statistics.median(r["tps"] for r in timed),
        "mfu": statistics.median(mfu) if mfu else None,
        "memory_gib": max(r.get("memory_gib", 0.0) for r in timed),
        "final_loss": rows[-1]["loss"],
    }


def render(results: list[dict], header: str) -> str:
    ref = next((r for r in results if r["variant"] == REFERENCE and "tps" in r), None)
    lines = [
        header,
        "",
        "| variant | tokens/s | MFU % | vs bf16 + compile | peak memory GiB |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['variant']} | failed: {' '.join(r['error'])} | | | |")
            continue
        mfu = f"{r['mfu']:.1f}" if r["mfu"] is not None else "n/a"
        ratio = f"{r['tps'] / ref['tps']:.3f}" if ref else "n/a"
        lines.append(
            f"| {r['variant']} | {r['tps']:,.0f} | {mfu} | {ratio} | {r['memory_gib']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="CPU rehearsal with the debug model")
    ap.add_argument("--steps", type=int_arg(1, 10**9), default=30)
    ap.add_argument(
        "--warmup", type=int_arg(0, 10**9), default=10, help="steps left out of the medians"
    )
    ap.add_argument("--seq-len", type=int_arg(1, 2**24), default=8192)
    ap.add_argument("--batch", type=int_arg(1, 2**20), default=1)
    ap.add_argument(
        "--memory-gib",
        type=float_arg(0, above=True),
        default=120.0,
        help="device memory to plan for (headroom left for the CUDA context)",
    )
    ap.add_argument(
        "--layers", type=int_arg(1, 32), default=None, help="blocks (default: most that fit)"
    )
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    ap.add_argument(
        "--timeout",
        type=float_arg(0, 30 * 24 * 3600, above=True),
        default=240,
        help="seconds per variant's run",
    )
    ap.add_argument(
        "--eager-only", action="store_true", help="leave the compiled variants out (rehearsals)"
    )
    args = ap.parse_args(argv)
    variants = VARIANTS
    if args.eager_only:
        variants = {k: v for k, v in variants.items() if "compile" not in k}
    if importlib.util.find_spec("torchao") is None:
        variants = {k: v for k, v in variants.items() if "float8" not in k}
        print("bench_float8: torchao is not importable: float8 variants left out", flush=True)

    if args.smoke:
        base = [
            "--config",
            str(DEBUG_TOML),
            "--eval.enabled",
            "false",
            "--training.seq_len",
            "64",
            "--training.local_batch_size",
            "2",
            "--training.mixed_precision_param",
            "float32",
            "--float8.emulate",
            "true",
        ]
        steps, warmup = 3, 1
        header = "CPU smoke run (debug model, float32, emulated float8): not a performance figure"
    else:
        base = [
            "--config",
            str(TOML_8B),
            "--model.tokenizer_path",
            "",
            "--training.seq_len",
            str(args.seq_len),
            "--training.local_batch_size",
            str(args.batch),
            "--training.dataset_path",
            "none",
            "--parallelism.data_parallel_shard_degree",
            "1",
        ]
        layers = args.layers or largest_fitting_layers(base, args.memory_gib, 32)
        base += ["--model.n_layers", str(layers)]
        steps, warmup = args.steps, args.warmup
        header = (
            f"Llama-3-8B-shaped, {layers} of 32 blocks, seq {args.seq_len} x batch "
            f"{args.batch}, one GPU, fp32 master weights with bf16 autocast, medians of steps "
            f"{warmup + 1}-{steps}"
        )
    print(f"bench_float8: {header}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_float8_") as tmp:
        results = []
        for name, extra in variants.items():
            results.append(run_variant(name, base, extra, steps, warmup, Path(tmp), args.timeout))
            print(f"bench_float8: {json.dumps(results[-1])}", flush=True)
            table = render(results, header)
            if args.out:  # what has run so far survives a run cut short
                args.out.write_text(table + "\n")
    print(table)
    return 0 if all("tps" in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
