"""A rank's module for `python -m titanlite.rank compile_cache_worker ARGS` under
titanlite.launch: it trains as titanlite.train does (titanlite.cli.outcome), then leaves what
this rank's compiles got from torch's graph caches (torch._dynamo's counters: Inductor's FX
graph cache as fxgraph_cache_hit/miss/..., AOTAutograd's as autograd_cache_...) in
DUMP/rank{r}_graph_caches.json."""

from __future__ import annotations

import json
import os
from pathlib import Path

from titanlite import cli


def outcome(argv: list[str]) -> tuple[int, str]:
    from torch._dynamo.utils import counters

    result = cli.outcome(argv)
    folder = Path(argv[argv.index("--job.dump_folder") + 1])
    caches = {
        name: count
        for group in ("inductor", "aot_autograd")
        for name, count in counters[group].items()
        if "_cache_" in name
    }
    (folder / f"rank{os.environ['RANK']}_graph_caches.json").write_text(json.dumps(caches))
    return result
