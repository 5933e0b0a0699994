"""Conway's Game of Life on a small wrapping grid.

The board is stored as a set of live cell coordinates instead of a 2D list.
For sparse patterns such as gliders this is both shorter to write and faster,
because only live cells and their neighbours are ever examined.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Iterable

Cell = tuple[int, int]

PATTERNS: dict[str, list[str]] = {
    "glider": [
        ".#.",
        "..#",
        "###",
    ],
    "blinker": [
        "###",
    ],
    "toad": [
        ".###",
        "###.",
    ],
    "beacon": [
        "##..",
        "##..",
        "..##",
        "..##",
    ],
}


def parse_pattern(rows: list[str], offset: Cell = (0, 0)) -> set[Cell]:
    """Turn a list of strings into a set of live cells.

    A '#' marks a live cell; anything else is dead. The offset lets callers
    place the pattern somewhere other than the top-left corner.
    """
    dy, dx = offset
    return {
        (y + dy, x + dx)
        for y, row in enumerate(rows)
        for x, ch in enumerate(row)
        if ch == "#"
    }


def neighbours(cell: Cell, height: int, width: int) -> Iterable[Cell]:
    y, x = cell
    for oy in (-1, 0, 1):
        for ox in (-1, 0, 1):
            if oy or ox:
                # Wrapping edges turn the board into a torus, so gliders
                # reappear on the other side instead of dying at the wall.
                yield ((y + oy) % height, (x + ox) % width)


def step(live: set[Cell], height: int, width: int) -> set[Cell]:
    """Advance the board by one generation."""
    counts = Counter(
        n for cell in live for n in neighbours(cell, height, width)
    )
    return {
        cell
        for cell, count in counts.items()
        if count == 3 or (count == 2 and cell in live)
    }


def render(live: set[Cell], height: int, width: int) -> str:
    lines = []
    for y in range(height):
        lines.append("".join("#" if (y, x) in live else "." for x in range(width)))
    return "\n".join(lines)


def run(pattern: str, height: int, width: int, generations: int, delay: float) -> set[Cell]:
    live = parse_pattern(PATTERNS[pattern], offset=(1, 1))
    seen: dict[frozenset[Cell], int] = {}
    for gen in range(generations):
        key = frozenset(live)
        if key in seen:
            # A repeated state means the pattern is periodic from here on.
            period = gen - seen[key]
            print(f"state repeats with period {period} at generation {gen}")
            break
        seen[key] = gen
        if delay > 0:
            print(f"generation {gen}  live={len(live)}")
            print(render(live, height, width))
            print()
            time.sleep(delay)
        live = step(live, height, width)
    return live


def main() -> None:
    parser = argparse.ArgumentParser(description="Tiny Game of Life")
    parser.add_argument("--pattern", choices=sorted(PATTERNS), default="glider")
    parser.add_argument("--height", type=int, default=8)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--generations", type=int, default=40)
    parser.add_argument("--delay", type=float, default=0.0,
                        help="seconds between frames; 0 disables drawing")
    args = parser.parse_args()
    final = run(args.pattern, args.height, args.width, args.generations, args.delay)
    print(render(final, args.height, args.width))


if __name__ == "__main__":
    main()
