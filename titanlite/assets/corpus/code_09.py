"""Union-find (disjoint sets) with two classic applications.

1. Kruskal's algorithm for a minimum spanning tree.
2. Generating a perfect maze: knock down walls between random cells as long
   as the two cells are not already connected.

Both rely on the same question -- "are these two items already in the same
group?" -- which union-find answers in nearly constant time.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)


class DisjointSet(Generic[T]):
    def __init__(self, items: Iterable[T] = ()) -> None:
        self.parent: dict[T, T] = {}
        self.size: dict[T, int] = {}
        self.groups = 0
        for item in items:
            self.add(item)

    def add(self, item: T) -> None:
        if item not in self.parent:
            self.parent[item] = item
            self.size[item] = 1
            self.groups += 1

    def find(self, item: T) -> T:
        root = item
        while self.parent[root] != root:
            root = self.parent[root]
        # Path compression: point every node on the way directly at the root
        # so later lookups along this path take a single step.
        while self.parent[item] != root:
            self.parent[item], item = root, self.parent[item]
        return root

    def union(self, a: T, b: T) -> bool:
        """Merge the groups of a and b; False if they were already joined."""
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return False
        # Union by size keeps the trees shallow.
        if self.size[ra] < self.size[rb]:
            ra, rb = rb, ra
        self.parent[rb] = ra
        self.size[ra] += self.size[rb]
        self.groups -= 1
        return True

    def connected(self, a: T, b: T) -> bool:
        return self.find(a) == self.find(b)


Edge = tuple[float, str, str]


def kruskal(nodes: Iterable[str], edges: Iterable[Edge]) -> tuple[float, list[Edge]]:
    """Return the total weight and edges of a minimum spanning forest."""
    sets: DisjointSet[str] = DisjointSet(nodes)
    chosen: list[Edge] = []
    total = 0.0
    for weight, a, b in sorted(edges):
        if sets.union(a, b):
            chosen.append((weight, a, b))
            total += weight
            if sets.groups == 1:
                break
    return total, chosen


Cell = tuple[int, int]


def generate_maze(width: int, height: int, seed: int | None = None) -> list[str]:
    """Return the maze as rows of text, '#' for walls and ' ' for passages."""
    rng = random.Random(seed)
    cells = [(y, x) for y in range(height) for x in range(width)]
    walls = [((y, x), (y, x + 1)) for y, x in cells if x + 1 < width]
    walls += [((y, x), (y + 1, x)) for y, x in cells if y + 1 < height]
    rng.shuffle(walls)

    sets: DisjointSet[Cell] = DisjointSet(cells)
    grid = [["#"] * (2 * width + 1) for _ in range(2 * height + 1)]
    for y, x in cells:
        grid[2 * y + 1][2 * x + 1] = " "
    for (y1, x1), (y2, x2) in walls:
        # Only open a wall if it joins two separate regions; opening one
        # inside a region would create a loop and the maze would no longer
        # have exactly one path between any two cells.
        if sets.union((y1, x1), (y2, x2)):
            grid[y1 + y2 + 1][x1 + x2 + 1] = " "
    grid[1][0] = " "
    grid[2 * height - 1][2 * width] = " "
    return ["".join(row) for row in grid]


if __name__ == "__main__":
    towns = ["ash", "birch", "cedar", "dale", "elm", "fern"]
    roads = [
        (7, "ash", "birch"), (9, "ash", "cedar"), (14, "ash", "fern"),
        (10, "birch", "cedar"), (15, "birch", "dale"), (11, "cedar", "dale"),
        (2, "cedar", "fern"), (6, "dale", "elm"), (9, "elm", "fern"),
    ]
    total, tree = kruskal(towns, roads)
    print(f"minimum road network costs {total:g}:")
    for weight, a, b in tree:
        print(f"  {a:>6} -- {b:<6} {weight:g}")
    print()
    print("\n".join(generate_maze(12, 6, seed=7)))
