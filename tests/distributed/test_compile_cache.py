"""Compiled graphs of a tensor-parallel run come back from Inductor's FX graph cache on the next
launch and train to the same losses, bit for bit; the AOTAutograd cache stays off under TP
(parallelisms/compile.py; docs/parallelism.md has what was measured for each cache)."""

import json
from pathlib import Path

import pytest
from helpers import TINY_RUN, check, launch_worker, read_jsonl

TP2_COMPILED = [
    *TINY_RUN,
    "--training.steps",
    "2",
    "--training.local_batch_size",
    "2",
    "--parallelism.tensor_parallel_degree",
    "2",
    "--training.compile",
]


def launch(folder: Path) -> tuple[list[float], list[dict]]:
    """Each step's loss and each rank's graph cache counters. The cache folder is the session's
    (tests/conftest.py): the first launch compiles only where no earlier session did."""
    check(
        launch_worker(2, "compile_cache_worker", [*TP2_COMPILED, "--job.dump_folder", str(folder)])
    )
    losses = [r["loss"] for r in read_jsonl(folder / "metrics.jsonl")]
    return losses, [json.loads((folder / f"rank{r}_graph_caches.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
def test_a_second_tensor_parallel_launch_reads_every_graph_from_the_cache(tmp_path):
    first_losses, first = launch(tmp_path / "first")
    second_losses, second = launch(tmp_path / "second")
    for rank in (0, 1):
        graphs = first[rank].get("fxgraph_cache_hit", 0) + first[rank].get("fxgraph_cache_miss", 0)
        # Each block's and the loss's forward and backward graphs, all read back on this rank.
        assert graphs == 4, first
        assert second[rank].get("fxgraph_cache_hit", 0) == graphs, second
        assert not any(name.startswith("autograd_cache") for name in first[rank] | second[rank])
    assert second_losses == first_losses and len(first_losses) == 2
