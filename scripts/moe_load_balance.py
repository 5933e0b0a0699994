"""Does the expert bias balance the experts? Trains the MoE debug preset on the bundled data
with `moe_load_balance = "expert_bias"` and with `"none"` (same seed, data and steps), reads
each run's per-layer max/mean tokens-per-expert from metrics.jsonl, prints the start and end
figures (the mean of the first and of the last 20 steps, per layer) and plots both curves.

    python scripts/moe_load_balance.py                     # 200 steps, docs/images/moe_load_balance.png
    python scripts/moe_load_balance.py --steps 50 --out /tmp/balance.png

The two runs go one after the other through ./run_train.sh (one process each).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from titanlite.core.arguments import ArgumentParser, int_arg  # noqa: E402

MODES = ("expert_bias", "none")
WINDOW = 20


def train(mode: str, steps: int, folder: Path) -> list[dict[str, float]]:
    """Each step's {layer: max/mean tokens per expert} of one run."""
    subprocess.run(
        [
            "./run_train.sh",
            "--config",
            "qwen3_moe_debug.toml",
            "--model.moe_load_balance",
            mode,
            "--training.steps",
            str(steps),
            "--metrics.enable_tensorboard",
            "false",
            "--job.dump_folder",
            str(folder),
        ],
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [r["moe_imbalance"] for r in records if "moe_imbalance" in r]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def summary(curves: dict[str, list[dict[str, float]]]) -> str:
    layers = sorted(next(iter(curves.values()))[0])
    lines = [
        f"max/mean tokens per expert, mean of the first and last {WINDOW} steps",
        "layer".ljust(28) + "".join(f"{m + ' start':>18}{m + ' end':>16}" for m in curves),
    ]
    for layer in layers:
        row = layer.ljust(28)
        for steps in curves.values():
            start = mean([s[layer] for s in steps[:WINDOW]])
            end = mean([s[layer] for s in steps[-WINDOW:]])
            row += f"{start:>18.3f}{end:>16.3f}"
        lines.append(row)
    return "\n".join(lines)


def plot(curves: dict[str, list[dict[str, float]]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5))
    for (mode, steps), color in zip(curves.items(), ("tab:blue", "tab:red")):
        for i, layer in enumerate(sorted(steps[0])):
            values = [s[layer] for s in steps]
            smooth = [mean(values[max(0, j - WINDOW + 1) : j + 1]) for j in range(len(values))]
            label = f"{mode}" if i == 0 else None
            axes.plot(range(1, len(values) + 1), smooth, color=color, alpha=0.8, label=label)
    axes.set_xlabel("step")
    axes.set_ylabel(f"max/mean tokens per expert ({WINDOW}-step mean)")
    axes.set_title("Qwen3 MoE debug model, one line per layer: expert bias vs no balancing")
    axes.axhline(1.0, color="grey", linewidth=0.5)
    axes.legend()
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)


def main() -> int:
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int_arg(1, 10**9), default=200)
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "moe_load_balance.png")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        curves = {mode: train(mode, args.steps, Path(tmp) / mode) for mode in MODES}
    print(summary(curves))
    plot(curves, args.out)
    print(f"plot: {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
