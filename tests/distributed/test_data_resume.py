"""The loader's position through a real DCP checkpoint (no model, so it is quick): saved by two
data-parallel ranks on gloo, loaded on one and on four, for both readers; the global window
stream continues exactly where the uninterrupted run's does."""

from pathlib import Path

import numpy as np
import pytest
import torch.distributed.checkpoint as dcp
from helpers import spawn

from titanlite.data import BUILTIN_DATASETS, ShardSet, Tokenizer, build_dataloader, list_files
from titanlite.data.prepare import prepare
from titanlite.data.tokenizer import BUILTIN_TOKENIZER

SEQ, GLOBAL_BATCH, SAVED_AT, AFTER = 47, 8, 6, 12


def _loader(kind, source, lbs, rank, dp):
    src = ShardSet(source) if kind == "shards" else list_files(Path(source))
    return build_dataloader(
        src,
        Tokenizer(BUILTIN_TOKENIZER),
        seq_len=SEQ,
        local_batch_size=lbs,
        dp_rank=rank,
        dp_size=dp,
        seed=11,
    )


def _save(rank, world, sources, out):
    loaders = {
        kind: _loader(kind, src, GLOBAL_BATCH // world, rank, world)
        for kind, src in sources.items()
    }
    for loader in loaders.values():
        it = iter(loader)
        for _ in range(SAVED_AT):
            next(it)
    dcp.save(loaders, checkpoint_id=out)


def _stream(loaders, steps):
    """The global batches the ranks read, in order: rank r's part is the r-th slice."""
    iters = [iter(d) for d in loaders]
    rows = []
    for _ in range(steps):
        for it in iters:
            x, y = next(it)
            rows.extend(np.concatenate([x.numpy(), y.numpy()[:, -1:]], axis=1))
    return np.stack(rows)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # loading in this process
def test_dp2_checkpoint_resumes_on_dp1_and_dp4(tmp_path):
    sources = {
        "shards": str(tmp_path / "shards"),
        "text": str(BUILTIN_DATASETS["titanlite_corpus"]),
    }
    prepare([BUILTIN_DATASETS["titanlite_corpus"]], tmp_path / "shards", shard_mb=0.04, quiet=True)
    out = str(tmp_path / "ckpt")
    spawn(_save, 2, sources, out)
    for kind, src in sources.items():
        reference = _stream([_loader(kind, src, GLOBAL_BATCH, 0, 1)], SAVED_AT + AFTER)[
            SAVED_AT * GLOBAL_BATCH :
        ]
        for dp in (1, 4):
            loaders = [_loader(kind, src, GLOBAL_BATCH // dp, r, dp) for r in range(dp)]
            for loader in loaders:
                dcp.load({kind: loader}, checkpoint_id=out)
            got = _stream(loaders, AFTER)
            assert got.shape == reference.shape and np.array_equal(got, reference), (kind, dp)
