"""Reading a TorchTitan training log into metrics.jsonl-shaped records, so that
scripts/loss_compare.py can put a TorchTitan run next to titanlite runs.

TorchTitan keeps no metrics file of its own unless TensorBoard or W&B is on; what every run has
is its console log, one line per logged step, e.g.

    [rank0]:[titan] ... - INFO - step:  3  loss:  6.83831  grad_norm:  2.1271
        memory:  3.54GiB(15.02%)  tps: 2,474  tflops: 0.18  mfu: 0.06%

(0.1.0 to 0.3.0 print the same fields; colour codes are stripped). Validation lines ("validate
step: N loss: ...") become `val_loss`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STEP = re.compile(r"(?<![\w.])step:\s*(\d+)\s+loss:\s*(-?[\d.]+|nan|inf)", re.IGNORECASE)
_FIELDS = {
    "grad_norm": re.compile(r"grad_norm:\s*([\d.]+|nan|inf)"),
    "memory_gib": re.compile(r"memory:\s*([\d.]+)GiB"),
    "tps": re.compile(r"tps:\s*([\d,]+)"),
    "tflops": re.compile(r"tflops:\s*([\d.]+)"),
    "mfu": re.compile(r"mfu:\s*([\d.]+)%"),
}


def is_torchtitan_log(path: Path) -> bool:
    """True for a text file holding at least one TorchTitan step line."""
    try:
        with path.open(errors="replace") as f:
            return any(_STEP.search(_ANSI.sub("", line)) for line in f)
    except OSError:
        return False


def read_torchtitan_log(path: Path) -> dict[int, dict[str, Any]]:
    """{step: record} with the keys titanlite's metrics.jsonl uses for the same figures
    (`loss`, `grad_norm`, `memory_gib`, `tps`, `tflops`, `mfu` in percent, `val_loss`); a step
    logged twice (a relaunch) keeps its last line, as metrics.jsonl readers do."""
    records: dict[int, dict[str, Any]] = {}
    for raw in path.read_text(errors="replace").splitlines():
        line = _ANSI.sub("", raw)
        m = _STEP.search(line)
        if m is None:
            continue
        step, value = int(m.group(1)), float(m.group(2))
        record = records.setdefault(step, {"step": step})
        if "validat" in line[: m.start()].lower():
            record["val_loss"] = value
            continue
        record["loss"] = value
        for key, pattern in _FIELDS.items():
            f = pattern.search(line, m.end())
            if f is not None:
                record[key] = float(f.group(1).replace(",", ""))
    return dict(sorted(records.items()))
