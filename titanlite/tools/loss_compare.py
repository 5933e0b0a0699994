"""Compare the metrics of two or more runs step by step, from their dump folders' metrics.jsonl
or TorchTitan training logs.

    python scripts/loss_compare.py RUN_A RUN_B [RUN...] [--metrics loss grad_norm]
        [--assert-equal | --rtol R | --atol A] [--plot out.png] [--summary-steps 4 20]

Each later run is compared with the first, on the steps every run logged. Prints each step's
values and differences, and per metric the largest difference. With --assert-equal, --rtol or
--atol, a training figure (loss, grad_norm, lr, val_loss) that differs by more than
atol + rtol x |first run's value| exits 1 (for CI and bisecting); timing and memory figures are
printed and plotted, never checked. A missing run, no common steps or an unknown metric exits 2.

A run given as a TorchTitan console log (its train.log) is read by `torchtitan_log`, so the same
recipe's curves sit side by side. --summary-steps prints, per run, the loss at those steps and
the median tokens/s after --tps-warmup steps, then, per kind of run (TorchTitan, titanlite), the
mean and range of each and whether the two kinds' ranges overlap: with one run per seed, that
says whether the curves agree within the seed spread.
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path
from typing import Any

from titanlite.components.metrics.file import FILE, read_metrics
from titanlite.config.schema import STEPS_MAX
from titanlite.core.arguments import ArgumentParser, float_arg, int_arg
from titanlite.core.errors import report
from titanlite.tools.loss_plot import PlotError, plot
from titanlite.tools.torchtitan_log import is_torchtitan_log, read_torchtitan_log

CHECKED = ("loss", "grad_norm", "lr", "val_loss")  # deterministic given the seed and layout
_MAX_ROWS = 40  # steps printed in full; more are summarized


class UsageError(ValueError):
    pass


def _file(path: Path) -> Path:
    return path / FILE if path.is_dir() else path


def load_run(path: Path) -> dict[int, dict[str, Any]]:
    file = _file(path)
    if not file.is_file():
        raise UsageError(
            f"{path}: no {FILE} there (give a run's job.dump_folder or a TorchTitan train.log)"
        )
    records = read_torchtitan_log(file) if is_torchtitan_log(file) else read_metrics(file)
    if not records:
        raise UsageError(f"{file}: no step records")
    return records


def split_label(arg: str) -> tuple[str | None, Path]:
    """`NAME=PATH` names a run; a plain path is named by `labels`."""
    name, sep, path = arg.partition("=")
    if sep and name and "/" not in name and not Path(arg).exists():
        return name, Path(path)
    return None, Path(arg)


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


def summarize(
    runs: list[dict[int, dict[str, Any]]],
    names: list[str],
    kinds: list[str],
    at: list[int],
    tps_warmup: int,
    out: Any = sys.stdout,
) -> None:
    """Per run: the loss at each step of `at` and the median tps after `tps_warmup` steps; per
    kind of run: the mean and range of each, and whether the kinds' loss ranges overlap."""
    for s in at:
        missing = [n for n, r in zip(names, runs) if r.get(s, {}).get("loss") is None]
        if missing:
            raise UsageError(f"no loss at step {s} in {', '.join(missing)}")
    cols = [f"loss@{s}" for s in at] + [f"median tps (steps>{tps_warmup})"]
    width = max(len(n) for n in names + ["run"])
    print(f"\n{'run':<{width}}  {'kind':<9}  " + "  ".join(f"{c:>10}" for c in cols), file=out)
    table: dict[str, list[list[float | None]]] = {}
    for run, name, kind in zip(runs, names, kinds):
        tps = [r["tps"] for s, r in run.items() if s > tps_warmup and r.get("tps")]
        row: list[float | None] = [run[s]["loss"] for s in at]
        row.append(statistics.median(tps) if tps else None)
        table.setdefault(kind, []).append(row)
        cells = [f"{v:.4f}" if v is not None else "n/a" for v in row[:-1]]
        cells.append("n/a" if row[-1] is None else f"{row[-1]:,.0f}")
        print(f"{name:<{width}}  {kind:<9}  " + "  ".join(f"{c:>10}" for c in cells), file=out)
    ranges: dict[str, list[tuple[float, float]]] = {}
    for kind, rows in table.items():
        stats = []
        for i, col in enumerate(cols):
            values = [v for r in rows if (v := r[i]) is not None]
            if not values:
                continue
            lo, hi = min(values), max(values)
            if i < len(at):
                ranges.setdefault(kind, []).append((lo, hi))
            stats.append(f"{col} {statistics.mean(values):.4g} [{lo:.4g}, {hi:.4g}]")
        print(f"{kind} ({len(rows)} runs): mean [range] " + "; ".join(stats), file=out)
    if len(ranges) == 2:
        (a, ra), (b, rb) = ranges.items()
        for s, (lo_a, hi_a), (lo_b, hi_b) in zip(at, ra, rb):
            overlap = lo_a <= hi_b and lo_b <= hi_a
            print(
                f"loss@{s}: the {a} and {b} ranges {'overlap' if overlap else 'do not overlap'}",
                file=out,
            )


def _fmt(v: Any) -> str:
    if v is None:
        return "null"
    return f"{v:.6g}" if isinstance(v, float) and math.isfinite(v) else str(v)


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="loss_compare", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "runs",
        nargs="+",
        help="dump folders, metrics.jsonl files or TorchTitan logs, each optionally NAME=PATH",
    )
    ap.add_argument("--metrics", nargs="+", default=["loss"], help="metrics.jsonl keys")
    ap.add_argument("--assert-equal", action="store_true", help="exit 1 unless exactly equal")
    ap.add_argument(
        "--rtol", type=float_arg(0, 1e6), default=None, help="relative tolerance (implies a check)"
    )
    ap.add_argument(
        "--atol", type=float_arg(0, 1e6), default=None, help="absolute tolerance (implies a check)"
    )
    ap.add_argument("--plot", type=Path, help="draw the metrics of every run into this PNG")
    ap.add_argument(
        "--summary-steps", nargs="+", type=int_arg(1, STEPS_MAX), help="summarize the loss at these"
    )
    ap.add_argument(
        "--tps-warmup", type=int_arg(0, STEPS_MAX), default=3, help="steps left out of median tps"
    )
    a = ap.parse_args(argv)
    if len(a.runs) < 2:
        ap.error("give at least two runs")
    check = a.assert_equal or a.rtol is not None or a.atol is not None
    tolerance = (a.rtol or 0.0, a.atol or 0.0) if check else None
    try:
        given = [split_label(r) for r in a.runs]
        paths = [p for _, p in given]
        runs = [load_run(p) for p in paths]
        names = [n or d for (n, _), d in zip(given, labels(paths))]
        bad = compare(runs, names, a.metrics, tolerance)
        if a.summary_steps:
            kinds = ["torchtitan" if is_torchtitan_log(_file(p)) else "titanlite" for p in paths]
            summarize(runs, names, kinds, a.summary_steps, a.tps_warmup)
        if a.plot is not None:
            plot(runs, names, a.metrics, a.plot)
            print(f"plot: {a.plot}")
    except (UsageError, PlotError) as e:
        return report(e, prog="loss_compare")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
