"""Count the import circles among titanlite's, models' and parallelisms' modules, function-local
imports included (grimp reads every import statement, wherever it stands).

    python scripts/import_cycles.py [--root DIR]

Prints each circle (a strongly connected group of modules, with one shortest loop through it)
and exits 1 when there is any. import-linter's contracts (scripts/lint.sh) enforce the layers;
this says how many circles there are, before and after a change.
"""

from __future__ import annotations

import sys
from pathlib import Path

import grimp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from titanlite.core.arguments import ArgumentParser  # noqa: E402

PACKAGES = ("titanlite", "models", "parallelisms")


def strongly_connected(graph: grimp.ImportGraph) -> list[list[str]]:
    """Tarjan's algorithm, iterative; groups of two or more modules (or one importing itself)."""
    modules = sorted(graph.modules)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[list[str]] = []
    counter = 0
    for root in modules:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args(argv)
    sys.path.insert(0, str(args.root))
    # The parser's import loaded titanlite from this checkout; grimp finds an imported package
    # by its module, so forget it: the packages grimp reads are those under --root.
    for name in [m for m in sys.modules if m.split(".")[0] in PACKAGES]:
        del sys.modules[name]
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    groups = strongly_connected(graph)
    for group in groups:
        loop = graph.find_shortest_chain(importer=group[0], imported=group[1]) or ()
        back = graph.find_shortest_chain(importer=group[1], imported=group[0]) or ()
        print(f"circle of {len(group)} modules: {' -> '.join([*loop, *back[1:]])}")
    print(f"{len(groups)} import circle(s) among {len(graph.modules)} modules")
    return 1 if groups else 0


if __name__ == "__main__":
    sys.exit(main())
