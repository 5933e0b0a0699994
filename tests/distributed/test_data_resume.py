"""The loader's position through a real DCP checkpoint (no model, so it is quick): saved by two
data-parallel ranks on gloo, loaded on one and on four, for both readers (the text reader also on
a Hugging Face dataset saved by `datasets`); the global window stream continues exactly where the
uninterrupted run's does."""

from pathlib import Path

import numpy as np
import pytest
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from helpers import corpus_paragraphs, save_hf_dataset, spawn

from titanlite.data import BUILTIN_DATASETS, ShardSet, Tokenizer, build_dataloader, list_files
from titanlite.data.prepare import prepare
from titanlite.data.tokenizer import BUILTIN_TOKENIZER

SEQ, GLOBAL_BATCH, SAVED_AT, AFTER = 47, 8, 6, 12


def _loader(kind, source, lbs, rank, dp, group=None):
    src = ShardSet(source) if kind == "shards" else list_files(Path(source))
    return build_dataloader(
        src,
        Tokenizer(BUILTIN_TOKENIZER),
        seq_len=SEQ,
        local_batch_size=lbs,
        dp_rank=rank,
        dp_size=dp,
        seed=11,
        tokenize_group=group,
    )


def _save(rank, world, sources, out):
    # The saving ranks share tokenizing the text stream, as the trainer's ranks do; the loading
    # side below tokenizes alone: the state means the same either way.
    loaders = {
        kind: _loader(kind, src, GLOBAL_BATCH // world, rank, world, dist.group.WORLD)
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
        "hf_saved": str(save_hf_dataset(tmp_path / "hf", corpus_paragraphs())),
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


def _shared_tokenizing(rank, world, corpus, steps, out):
    loader = _loader("text", corpus, GLOBAL_BATCH // world, rank, world, dist.group.WORLD)
    it = iter(loader)
    rows = [
        np.concatenate([x.numpy(), y.numpy()[:, -1:]], axis=1)
        for x, y in (next(it) for _ in range(steps))
    ]
    np.save(f"{out}/rank{rank}.npy", np.concatenate(rows))
    enc = loader.dataset.encoder
    np.save(f"{out}/tokenized{rank}.npy", np.array([enc.tokens_tokenized, enc.exchanges]))


@pytest.mark.slow
def test_ranks_sharing_the_tokenizing_read_exactly_the_one_process_stream(tmp_path):
    """Each of 4 ranks tokenizes about a quarter of the documents, and together they still cut
    exactly the windows one process cuts alone, over several exchanges and epochs."""
    corpus = str(BUILTIN_DATASETS["titanlite_corpus"])
    world, steps = 4, 2500
    alone = _loader("text", corpus, GLOBAL_BATCH, 0, 1)
    reference = _stream([alone], steps)
    assert alone.dataset.epoch >= 1  # the stream wrapped: epochs are covered too
    spawn(_shared_tokenizing, world, corpus, steps, str(tmp_path))
    got = np.concatenate(
        [np.load(tmp_path / f"rank{r}.npy").reshape(steps, -1, SEQ + 1) for r in range(world)],
        axis=1,
    ).reshape(-1, SEQ + 1)
    assert np.array_equal(got, reference)
    tokenized, exchanges = zip(*(np.load(tmp_path / f"tokenized{r}.npy") for r in range(world)))
    assert min(exchanges) == max(exchanges) >= 2, exchanges
    assert sum(tokenized) >= reference.size  # all the stream's tokens (and some read ahead)
    assert max(tokenized) < 0.3 * sum(tokenized), tokenized  # a quarter each, give or take
