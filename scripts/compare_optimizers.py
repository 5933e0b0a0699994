"""Muon vs AdamW on the bundled data: each at its best learning rate from a small sweep, then
both timed side by side on 1 and 2 processes.

    python scripts/compare_optimizers.py                  # 150 steps per run, the table of docs/optimizers.md
    python scripts/compare_optimizers.py --steps 40 --adamw-lrs 3e-3 --muon-lrs 1e-2

The debug preset (Llama 3 debug model, fp32, one process) trains on the bundled corpus minus
four held-out documents (one of code, three of prose: 10%), which give the validation loss at
the end; the same seed, data order, schedule and steps for every run. Muon's lr is the Muon
matrices' and, as `adamw_lr` is left unset, also the AdamW group's (match_rms_adamw makes one lr
serve both). Timing: the best lr of each (Muon with torch's bf16 Newton-Schulz and with fp32),
in turn twice, the median step time after the first 5 steps, on one process and on FSDP 2
(NGPU=2), through ./run_train.sh; `--timing-only` times the first lr of each list, no sweep.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from titanlite.core.arguments import ArgumentParser, float_arg, int_arg  # noqa: E402

CORPUS = ROOT / "titanlite" / "assets" / "corpus"
HELD_OUT = ("code_10.py", "prose_28.txt", "prose_29.txt", "prose_30.txt")
WARM_STEPS = 5


def split_corpus(folder: Path) -> tuple[Path, Path]:
    """The bundled corpus as a training folder and a held-out folder."""
    train, held = folder / "train", folder / "held_out"
    train.mkdir()
    held.mkdir()
    names = {p.name for p in CORPUS.iterdir()}
    missing = [n for n in HELD_OUT if n not in names]
    if missing:
        raise SystemExit(f"compare_optimizers: error: {missing} not in {CORPUS}")
    for p in sorted(CORPUS.iterdir()):
        if p.name != "README.md":
            shutil.copy(p, (held if p.name in HELD_OUT else train) / p.name)
    return train, held


def train(
    optimizer: str,
    lr: float,
    steps: int,
    data: tuple[Path, Path],
    folder: Path,
    nproc: int = 1,
    extra: tuple[str, ...] = (),
) -> list[dict]:
    """metrics.jsonl of one ./run_train.sh run."""
    cmd = [
        "./run_train.sh",
        *extra,
        "--optimizer.name",
        optimizer,
        "--optimizer.lr",
        str(lr),
        "--training.steps",
        str(steps),
        "--training.dataset_path",
        str(data[0]),
        "--validation.enabled",
        "--validation.dataset_path",
        str(data[1]),
        "--validation.freq",
        str(steps),
        "--metrics.enable_tensorboard",
        "false",
        "--eval.enabled",
        "false",
        "--job.dump_folder",
        str(folder),
    ]
    env = {**os.environ, "NGPU": str(nproc)}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(
            f"compare_optimizers: error: {' '.join(cmd)} failed:\n{done.stderr[-2000:]}"
        )
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def final_losses(records: list[dict]) -> tuple[float, float]:
    """(mean training loss of the last 10 steps, validation loss after the last step)."""
    losses = [r["loss"] for r in records if "loss" in r]
    val = [r["val_loss"] for r in records if "val_loss" in r]
    return statistics.fmean(losses[-10:]), val[-1]


def median_step_time(records: list[dict]) -> float:
    times = [r["step_time_s"] for r in records if "step_time_s" in r and r["step"] > WARM_STEPS]
    return statistics.median(times)


def sweep(name: str, lrs: list[float], steps: int, data, folder: Path) -> dict[float, tuple]:
    results = {}
    for lr in lrs:
        results[lr] = final_losses(train(name, lr, steps, data, folder / f"{name}_{lr:g}"))
        print(f"{name:6} lr {lr:<8g} train {results[lr][0]:.4f}  validation {results[lr][1]:.4f}")
    return results


def main() -> None:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int_arg(WARM_STEPS + 1), default=150)
    lr_list = float_arg(above=True)
    parser.add_argument("--adamw-lrs", type=lr_list, nargs="+", default=[1e-3, 3e-3, 1e-2])
    parser.add_argument("--muon-lrs", type=lr_list, nargs="+", default=[3e-3, 1e-2, 3e-2])
    parser.add_argument("--timing-steps", type=int_arg(WARM_STEPS + 3), default=30)
    parser.add_argument(
        "--timing-only", action="store_true", help="no sweep: time the first lr of each list"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        data = split_corpus(folder)
        best = {}
        for name, lrs in (("AdamW", args.adamw_lrs), ("Muon", args.muon_lrs)):
            if args.timing_only:
                break
            results = sweep(name, lrs, args.steps, data, folder)
            best[name] = min(results, key=lambda lr: results[lr][1])
        if best:
            print(f"\n{args.steps} steps, best lr by validation loss:")
            for name, lr in best.items():
                print(f"  {name}: lr {lr:g}")
        if args.timing_only:
            best = {"AdamW": args.adamw_lrs[0], "Muon": args.muon_lrs[0]}
        # Muon's Newton-Schulz in float32 too: this CPU has no native bf16 (torch's default).
        variants = {
            "AdamW": ("AdamW", best["AdamW"], ()),
            "Muon": ("Muon", best["Muon"], ()),
            "Muon fp32 NS": ("Muon", best["Muon"], ("--optimizer.muon_ns_dtype", "float32")),
        }
        print("\nmedian step time (s), ABCABC, best lr each:")
        for nproc in (1, 2):
            times: dict[str, list[float]] = {name: [] for name in variants}
            for rep in range(2):
                for name, (optimizer, lr, extra) in variants.items():
                    run = folder / f"time_{name.replace(' ', '_')}_{nproc}_{rep}"
                    records = train(optimizer, lr, args.timing_steps, data, run, nproc, extra)
                    times[name].append(median_step_time(records))
            mean = {name: statistics.fmean(t) for name, t in times.items()}
            print(
                f"  {nproc} process(es): "
                + "  ".join(f"{n} {t:.3f} ({t / mean['AdamW']:.2f}x)" for n, t in mean.items())
            )


if __name__ == "__main__":
    main()
