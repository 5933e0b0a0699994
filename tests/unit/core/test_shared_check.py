"""shared_check's exchange through the store: results of every rank, and a rank whose progress
stands still named (the wait is bounded by progress, not by the check's length)."""

import json
import threading
import time

import pytest
import torch.distributed as dist

from titanlite.core.distributed import _results


def test_waits_while_progress_is_made_and_names_a_stalled_rank():
    store, tag = dist.HashStore(), "t"
    store.set(f"{tag}/result/0", json.dumps(["a"]))

    def slow_rank_1():  # 12 items of 0.1 s: longer than the stall limit, progress every item
        for done in range(1, 13):
            time.sleep(0.1)
            store.set(f"{tag}/progress/1", str(done))
        store.set(f"{tag}/result/1", json.dumps(["b"]))

    worker = threading.Thread(target=slow_rank_1)
    start = time.monotonic()
    worker.start()
    assert _results(store, tag, 2, stall_seconds=0.35) == [["a"], ["b"]]
    assert time.monotonic() - start >= 1.2
    worker.join()

    store.set("u/result/0", json.dumps([]))
    store.set("u/progress/1", "3")
    with pytest.raises(TimeoutError, match=r"rank 1 made no progress .* for 0s \(items done: 3\)"):
        _results(store, "u", 2, stall_seconds=0.3)
