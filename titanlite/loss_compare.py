"""Compare the metrics of two or more runs step by step, from their dump folders' metrics.jsonl.

    python scripts/loss_compare.py RUN_A RUN_B [RUN...] [--metrics loss grad_norm]
        [--assert-equal | --rtol R | --atol A] [--plot out.png]

Each later run is compared with the first, on the steps every run logged. Prints each step's
values and differences, and per metric the largest difference. With --assert-equal, --rtol or
--atol, a training figure (loss, grad_norm, lr, val_loss) that differs by more than
atol + rtol x |first run's value| exits 1 (for CI and bisecting); timing and memory figures are
printed and plotted, never checked. A missing run, no common steps or an unknown metric exits 2.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from titanlite.metrics_file import FILE, read_metrics

CHECKED = ("loss", "grad_norm", "lr", "val_loss")  # deterministic given the seed and layout
_MAX_ROWS = 40  # steps printed in full; more are summarized


class UsageError(ValueError):
    pass


def load_run(path: Path) -> dict[int, dict[str, Any]]:
    file = path / FILE if path.is_dir() else path
    if not file.is_file():
        raise UsageError(f"{path}: no {FILE} there (give a run's job.dump_folder)")
    records = read_metrics(file)
    if not records:
        raise UsageError(f"{file}: no step records")
    return records


def labels(paths: list[Path]) -> list[str]:
    """Folder names where they tell the runs apart, else the paths as given."""
    names = [p.name if p.is_dir() else p.parent.name for p in paths]
    return names if len(set(names)) == len(names) else [str(p) for p in paths]


def mismatch(a: Any, b: Any, rtol: float, atol: float) -> bool:
    if a is None or b is None:  # null: a non-finite figure (a skipped step)
        return (a is None) != (b is None)
    return abs(b - a) > atol + rtol * abs(a)


def compare(
    runs: list[dict[int, dict[str, Any]]],
    names: list[str],
    metrics: list[str],
    tolerance: tuple[float, float] | None,
    out: Any = sys.stdout,
) -> int:
    """Print the comparison; the number of (step, metric, run) values beyond the tolerance."""
    steps = sorted(set.intersection(*(set(r) for r in runs)))
    if not steps:
        spans = ", ".join(f"{n}: {min(r)}-{max(r)}" for n, r in zip(names, runs))
        raise UsageError(f"the runs have no logged step in common ({spans})")
    for m in metrics:
        if not any(m in r[s] for r in runs for s in steps):
            raise UsageError(f"no run logged '{m}' (logged: {', '.join(runs[0][steps[0]])})")
    rtol, atol = tolerance or (0.0, 0.0)
    header = [f"{m}[{n}]" for m in metrics for n in names]
    header += [f"{m} {n}-{names[0]}" for m in metrics for n in names[1:]]
    widths = [max(12, len(h)) for h in header]
    print("step  " + "  ".join(f"{h:>{w}}" for h, w in zip(header, widths)), file=out)
    bad: dict[str, list[int]] = {m: [] for m in metrics}
    largest = dict.fromkeys(metrics, (0.0, steps[0]))
    for i, s in enumerate(steps):
        cells = [_fmt(r[s].get(m)) for m in metrics for r in runs]
        for m in metrics:
            a = runs[0][s].get(m)
            for r in runs[1:]:
                b = r[s].get(m)
                diff = None if a is None or b is None else b - a
                cells.append("null" if diff is None else f"{diff:+.3e}")
                if diff is not None and abs(diff) > largest[m][0]:
                    largest[m] = (abs(diff), s)
                if tolerance is not None and m in CHECKED and mismatch(a, b, rtol, atol):
                    bad[m].append(s)
        if len(steps) <= _MAX_ROWS or i < _MAX_ROWS // 2 or i >= len(steps) - _MAX_ROWS // 2:
            print(f"{s:>4}  " + "  ".join(f"{c:>{w}}" for c, w in zip(cells, widths)), file=out)
        elif i == _MAX_ROWS // 2:
            print(f"  ... {len(steps) - _MAX_ROWS} steps not shown ...", file=out)
    every = set().union(*runs)
    gaps = "".join(
        f"; {n} lacks {len(every) - len(r)} step(s) another run logged"
        for n, r in zip(names, runs)
        if len(r) < len(every)
    )
    print(f"{len(steps)} common steps ({steps[0]}-{steps[-1]}){gaps}", file=out)
    for m in metrics:
        d, s = largest[m]
        verdict = ""
        if tolerance is not None and m in CHECKED:
            verdict = (
                f": {len(bad[m])} step(s) beyond rtol {rtol:g}, atol {atol:g}, first at step "
                f"{bad[m][0]}"
                if bad[m]
                else f": equal within rtol {rtol:g}, atol {atol:g}"
            )
        print(f"{m}: largest difference {d:.3e} at step {s}{verdict}", file=out)
    return sum(len(v) for v in bad.values())


def _fmt(v: Any) -> str:
    if v is None:
        return "null"
    return f"{v:.6g}" if isinstance(v, float) and math.isfinite(v) else str(v)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="loss_compare", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="dump folders (or metrics.jsonl files)")
    ap.add_argument("--metrics", nargs="+", default=["loss"], help="metrics.jsonl keys")
    ap.add_argument("--assert-equal", action="store_true", help="exit 1 unless exactly equal")
    ap.add_argument("--rtol", type=float, default=None, help="relative tolerance (implies a check)")
    ap.add_argument("--atol", type=float, default=None, help="absolute tolerance (implies a check)")
    ap.add_argument("--plot", type=Path, help="draw the metrics of every run into this PNG")
    a = ap.parse_args(argv)
    if len(a.runs) < 2:
        ap.error("give at least two runs")
    check = a.assert_equal or a.rtol is not None or a.atol is not None
    tolerance = (a.rtol or 0.0, a.atol or 0.0) if check else None
    try:
        runs = [load_run(p) for p in a.runs]
        names = labels(a.runs)
        bad = compare(runs, names, a.metrics, tolerance)
        if a.plot is not None:
            from titanlite.loss_plot import plot

            plot(runs, names, a.metrics, a.plot)
            print(f"plot: {a.plot}")
    except UsageError as e:
        print(f"loss_compare: error: {e}", file=sys.stderr)
        return 2
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
