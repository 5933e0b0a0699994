"""The curves of several runs on one figure: one panel per metric, one line per run (for
scripts/loss_compare.py --plot). matplotlib is optional: pip install 'titanlite[plot]'."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class PlotError(ValueError):
    """The figure cannot be made (matplotlib missing, no such folder); the message says why."""


def plot(runs: list[dict[int, dict[str, Any]]], names: list[str], metrics: list[str], out: Path):
    try:
        import matplotlib
    except ImportError:
        raise PlotError("--plot needs matplotlib: pip install 'titanlite[plot]'") from None
    matplotlib.use("Agg")  # files only: no display needed, none opened
    import matplotlib.pyplot as plt

    if not out.parent.is_dir():
        raise PlotError(f"--plot {out}: folder {out.parent} does not exist")
    fig, axes = plt.subplots(len(metrics), 1, figsize=(8, 2.8 * len(metrics)), squeeze=False)
    for ax, m in zip(axes[:, 0], metrics):
        for run, name in zip(runs, names):
            points = [(s, r[m]) for s, r in run.items() if r.get(m) is not None]
            if points:
                ax.plot(*zip(*points), label=name, linewidth=1.2)
        ax.set_ylabel(m)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    axes[0, 0].legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
