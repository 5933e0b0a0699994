"""csvsummary: describe the columns of a CSV file at a glance.

For each column it guesses a type (integer, float, boolean, date or text)
and prints a short summary: missing values, min/max/mean/median for numbers,
the date range for dates, and the most common values for text.

    python csvsummary.py sales.csv
    python csvsummary.py --delimiter ';' --top 3 export.csv
    python csvsummary.py --demo
"""

from __future__ import annotations

import argparse
import csv
import io
import statistics
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from typing import TextIO

MISSING = {"", "na", "n/a", "null", "none", "-"}

DEMO_CSV = """date,store,product,units,price,returned
2024-03-01,north,kettle,3,24.50,no
2024-03-01,south,toaster,1,31.00,no
2024-03-02,north,toaster,2,31.00,yes
2024-03-02,east,mug,12,4.25,no
2024-03-03,south,kettle,,24.50,no
2024-03-03,north,mug,8,4.25,no
2024-03-04,east,kettle,5,22.00,no
2024-03-05,south,mug,20,3.90,n/a
"""


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "yes", "y"):
        return True
    if lowered in ("false", "no", "n"):
        return False
    raise ValueError(text)


# Order matters: the first parser that accepts every value wins, so the
# strictest types come first and text is the fallback.
PARSERS: list[tuple[str, Callable[[str], object]]] = [
    ("integer", int),
    ("float", float),
    ("boolean", _parse_bool),
    ("date", date.fromisoformat),
]


@dataclass
class Column:
    name: str
    raw: list[str] = field(default_factory=list)

    @property
    def present(self) -> list[str]:
        return [v for v in self.raw if v.strip().lower() not in MISSING]

    @property
    def missing(self) -> int:
        return len(self.raw) - len(self.present)

    def infer(self) -> tuple[str, list[object]]:
        values = [v.strip() for v in self.present]
        if not values:
            return "empty", []
        for kind, parser in PARSERS:
            try:
                return kind, [parser(v) for v in values]
            except ValueError:
                continue
        return "text", values


def read_columns(stream: TextIO, delimiter: str) -> dict[str, Column]:
    reader = csv.reader(stream, delimiter=delimiter)
    try:
        header = next(reader)
    except StopIteration:
        return {}
    columns = {name: Column(name) for name in header}
    for line_no, row in enumerate(reader, start=2):
        if len(row) != len(header):
            # Ragged rows are common in hand-edited files; warn and pad.
            print(f"warning: line {line_no} has {len(row)} fields, expected {len(header)}",
                  file=sys.stderr)
            row = (row + [""] * len(header))[: len(header)]
        for name, value in zip(header, row, strict=True):
            columns[name].raw.append(value)
    return columns


def describe(column: Column, top: int) -> list[str]:
    kind, values = column.infer()
    lines = [f"{column.name}  ({kind}, {len(column.raw)} rows, {column.missing} missing)"]
    if kind in ("integer", "float"):
        nums = [float(v) for v in values]  # type: ignore[arg-type]
        lines.append(f"  min {min(nums):g}  max {max(nums):g}  "
                     f"mean {statistics.fmean(nums):.3g}  median {statistics.median(nums):g}")
        if len(nums) > 1:
            lines.append(f"  stdev {statistics.stdev(nums):.3g}  sum {sum(nums):g}")
    elif kind == "date":
        first, last = min(values), max(values)  # type: ignore[type-var]
        lines.append(f"  from {first} to {last} ({(last - first).days} days)")
    elif kind == "boolean":
        true_count = sum(1 for v in values if v)
        lines.append(f"  true {true_count}  false {len(values) - true_count}")
    elif kind == "text":
        counts = Counter(values)
        lines.append(f"  {len(counts)} distinct values")
        for value, count in counts.most_common(top):
            lines.append(f"    {value!s:<16} {count}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="csvsummary", description="Summarize CSV columns.")
    parser.add_argument("path", nargs="?", help="CSV file to read ('-' for stdin)")
    parser.add_argument("--delimiter", default=",", help="field separator (default ',')")
    parser.add_argument("--top", type=int, default=5, help="common values to show for text")
    parser.add_argument("--demo", action="store_true", help="summarize a built-in sample")
    args = parser.parse_args(argv)

    if args.demo or args.path is None:
        stream: TextIO = io.StringIO(DEMO_CSV)
    elif args.path == "-":
        stream = sys.stdin
    else:
        try:
            # newline="" lets the csv module handle quoted line breaks itself.
            stream = open(args.path, newline="", encoding="utf-8-sig")
        except OSError as exc:
            print(f"csvsummary: {exc}", file=sys.stderr)
            return 1

    with stream:
        columns = read_columns(stream, args.delimiter)
    if not columns:
        print("no data")
        return 0
    for column in columns.values():
        print("\n".join(describe(column, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
