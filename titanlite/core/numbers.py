"""Bounded numbers read from text: every numeric knob of every entry point (a config field, a
--dry-run option, a script's argument, NGPU) is a number within a stated range before anything
uses it. A bare int() takes 10**30 (then overflows a C long far from the flag that caused it) and
-1 (then writes shards of no size); float() takes nan and inf."""

from __future__ import annotations

import math

# What a C int64 holds: the widest integer torch, numpy and the collectives take.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# What a C int32 holds: NCCL's flight-recorder size, numpy seeds, argparse counts fed to C.
INT32_MAX = 2**31 - 1


class NumberError(ValueError):
    """A number that is not one, or is outside its range; the message names the knob."""


def read_int(text: object, name: str, low: int, high: int) -> int:
    """`text` (a str or an int) as an integer in [low, high]; NumberError naming `name`."""
    if isinstance(text, bool):
        raise NumberError(f"{name} = {text!r}: expected an integer")
    if isinstance(text, int):
        value = text
    else:
        try:
            value = int(str(text).strip().replace("_", ""), 0)
        except ValueError:
            raise NumberError(f"{name} = {text!r}: expected an integer") from None
    check_range(value, name, low, high)
    return value


def read_float(text: object, name: str, low: float, high: float) -> float:
    """`text` as a finite float in [low, high]; NumberError naming `name`."""
    if isinstance(text, bool):
        raise NumberError(f"{name} = {text!r}: expected a number")
    try:
        value = float(text) if isinstance(text, (int, float)) else float(str(text).strip())
    except (ValueError, OverflowError):
        raise NumberError(f"{name} = {text!r}: expected a number") from None
    if not math.isfinite(value):
        raise NumberError(f"{name} = {text!r}: expected a finite number")
    check_range(value, name, low, high)
    return value


def check_range(value: float, name: str, low: float, high: float) -> None:
    """NumberError unless low <= value <= high; the message says which bound it crossed."""
    if value < low:
        raise NumberError(f"{name} = {_shown(value)}: must be >= {_shown(low)}")
    if value > high:
        raise NumberError(f"{name} = {_shown(value)}: must be <= {_shown(high)}")


def _shown(number: float) -> str:
    return str(number) if isinstance(number, int) else f"{number:g}"
