"""Reading metrics.jsonl back (the trainer's goodput accounting, scripts/loss_compare.py).

A launch appends one JSON object per logged step; a relaunch from a checkpoint appends the steps
it trains again, so the last record of a step is the one that counts. A line that is not a JSON
object with an integer step (torn by a crash mid-write) is skipped: the writer starts the next
record on a line of its own, and a torn record must not make a good run unreadable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FILE = "metrics.jsonl"


def read_metrics(path: Path) -> dict[int, dict[str, Any]]:
    """{step: record} of a metrics.jsonl file (the last record of each step), in step order."""
    records: dict[int, dict[str, Any]] = {}
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
            step = record["step"]
        except (ValueError, TypeError, KeyError):
            continue
        if isinstance(step, int):
            records[step] = record
    return dict(sorted(records.items()))
