"""Command-line arguments for titanlite's scripts: a parser whose mistakes are one line and exit 2
(docs/failures.md), and argument types that are bounded numbers (titanlite.core.numbers)."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import NoReturn

from titanlite.core.errors import USER_ERROR, error_line
from titanlite.core.numbers import INT64_MAX, NumberError, read_float, read_int


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, except that a mistake is one line (argparse prints its usage block
    first, which buries the line that says what is wrong) and exit 2."""

    def error(self, message: str) -> NoReturn:
        print(error_line(f"{message} (--help shows the usage)", self.prog), file=sys.stderr)
        sys.exit(USER_ERROR)


def int_arg(low: int = 1, high: int = INT64_MAX) -> Callable[[str], int]:
    """An argparse `type`: an integer in [low, high] (default: a positive count)."""

    def parse(text: str) -> int:
        try:
            return read_int(text, "value", low, high)
        except NumberError as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix("value = ")) from None

    parse.__name__ = f"integer in [{low}, {high}]"
    return parse


def float_arg(
    low: float = 0.0, high: float = float("inf"), above: bool = False
) -> Callable[[str], float]:
    """An argparse `type`: a finite number in [low, high]; `above` excludes `low` itself (a
    size or a time that must be more than nothing)."""

    def parse(text: str) -> float:
        try:
            value = read_float(text, "value", -math.inf, high)
        except NumberError as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix("value = ")) from None
        if value < low or (above and value == low):
            raise argparse.ArgumentTypeError(f"{text}: must be {'>' if above else '>='} {low:g}")
        return value

    parse.__name__ = f"number in {'(' if above else '['}{low:g}, {high:g}]"
    return parse
