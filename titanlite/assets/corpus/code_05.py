"""Shortest paths on a weighted graph with Dijkstra's algorithm.

The graph is an adjacency dictionary. A binary heap from ``heapq`` holds the
frontier; instead of a decrease-key operation we push duplicate entries and
skip stale ones when they are popped, which is simpler and usually just as
fast in Python.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Hashable, Iterable

Node = Hashable
Graph = dict[Node, dict[Node, float]]


def build_graph(edges: Iterable[tuple[Node, Node, float]], directed: bool = False) -> Graph:
    """Create an adjacency map from (source, target, weight) triples."""
    graph: Graph = defaultdict(dict)
    for src, dst, weight in edges:
        if weight < 0:
            # Dijkstra's greedy choice is only valid for non-negative weights.
            raise ValueError(f"negative weight on edge {src}->{dst}")
        graph[src][dst] = min(weight, graph[src].get(dst, math.inf))
        if not directed:
            graph[dst][src] = min(weight, graph[dst].get(src, math.inf))
        else:
            graph.setdefault(dst, {})
    return dict(graph)


def dijkstra(graph: Graph, source: Node) -> tuple[dict[Node, float], dict[Node, Node | None]]:
    """Return distances and predecessor links for every reachable node."""
    dist: dict[Node, float] = {source: 0.0}
    prev: dict[Node, Node | None] = {source: None}
    # The counter breaks ties so heapq never has to compare node objects.
    counter = 0
    heap: list[tuple[float, int, Node]] = [(0.0, counter, source)]
    done: set = set()
    while heap:
        d, _, node = heapq.heappop(heap)
        if node in done:
            continue
        done.add(node)
        for neighbour, weight in graph.get(node, {}).items():
            candidate = d + weight
            if candidate < dist.get(neighbour, math.inf):
                dist[neighbour] = candidate
                prev[neighbour] = node
                counter += 1
                heapq.heappush(heap, (candidate, counter, neighbour))
    return dist, prev


def reconstruct(prev: dict[Node, Node | None], target: Node) -> list[Node]:
    """Walk predecessor links back from target; empty if unreachable."""
    if target not in prev:
        return []
    path = [target]
    while (step := prev[path[-1]]) is not None:
        path.append(step)
    path.reverse()
    return path


def shortest_path(graph: Graph, source: Node, target: Node) -> tuple[float, list[Node]]:
    dist, prev = dijkstra(graph, source)
    return dist.get(target, math.inf), reconstruct(prev, target)


def grid_graph(rows: list[str]) -> tuple[Graph, Node, Node]:
    """Build a graph from a text maze.

    '#' is a wall, digits are cells with that movement cost, '.' costs 1,
    'S' marks the start and 'G' the goal.
    """
    edges = []
    start = goal = None
    cost = {}
    for y, row in enumerate(rows):
        for x, ch in enumerate(row):
            if ch == "#":
                continue
            cost[(y, x)] = int(ch) if ch.isdigit() else 1
            if ch == "S":
                start = (y, x)
            elif ch == "G":
                goal = (y, x)
    for y, x in cost:
        for ny, nx in ((y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1)):
            if (ny, nx) in cost:
                # Entering a cell costs that cell's weight, so edges are directed.
                edges.append(((y, x), (ny, nx), float(cost[(ny, nx)])))
    if start is None or goal is None:
        raise ValueError("maze needs both S and G")
    return build_graph(edges, directed=True), start, goal


def draw_path(rows: list[str], path: list[Node]) -> str:
    grid = [list(row) for row in rows]
    for y, x in path[1:-1]:
        grid[y][x] = "*"
    return "\n".join("".join(row) for row in grid)


if __name__ == "__main__":
    roads = build_graph([
        ("harbor", "market", 4), ("harbor", "mill", 2), ("mill", "market", 1),
        ("market", "bridge", 5), ("mill", "bridge", 8), ("bridge", "castle", 3),
    ])
    total, route = shortest_path(roads, "harbor", "castle")
    print(f"harbor -> castle: {total:g} via {' -> '.join(route)}")

    maze = [
        "S..#......",
        ".#.#.####.",
        ".#...9..#.",
        ".####.#.#.",
        "......#..G",
    ]
    graph, start, goal = grid_graph(maze)
    total, route = shortest_path(graph, start, goal)
    print(f"maze cost {total:g}, {len(route) - 1} steps")
    print(draw_path(maze, route))
