"""The loader's position through a real DCP checkpoint (no model, so it is quick): saved by two
data-parallel ranks on gloo, loaded on one and on four, for both readers (the text reader also on
a Hugging Face dataset saved by `datasets`); the global window stream continues exactly where the
uninterrupted run's does."""

import json
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
        tokenize_groups=[group],
    )


def _save(rank, world, sources, out):
    # The saving ranks share tokenizing the text stream, as the trainer's ranks do (each text
    # reader on a group of its own: its thread exchanges on it at any time); the loading side
    # below tokenizes alone: the state means the same either way.
    loaders = {
        kind: _loader(kind, src, GLOBAL_BATCH // world, rank, world, dist.new_group(backend="gloo"))
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
    """The trainer's way on a (dp 2, tp 2) layout: the exchange group from the meshes, the loader
    iterated on this (the training) thread; every all_gather is recorded with its thread and
    group."""
    import threading

    from parallelisms.parallel_dims import ParallelDims
    from titanlite.data.split_tokenize import exchange_group

    meshes = ParallelDims.resolve(1, -1, 2, world).build_meshes("cpu")
    dp_rank, dp = meshes.dp.get_local_rank(), meshes.dp.size()
    exchanges = []
    all_gather = dist.all_gather

    def watched(*args, group=None, **kwargs):
        main = threading.current_thread() is threading.main_thread()
        ranks = dist.get_process_group_ranks(group) if group is not None else None
        exchanges.append((main, group is None or group is dist.group.WORLD, ranks))
        return all_gather(*args, group=group, **kwargs)

    dist.all_gather = watched
    loader = _loader(
        "text", corpus, GLOBAL_BATCH // dp, dp_rank, dp, exchange_group(meshes.dp_groups())
    )
    it = iter(loader)
    rows = [
        np.concatenate([x.numpy(), y.numpy()[:, -1:]], axis=1)
        for x, y in (next(it) for _ in range(steps))
    ]
    loader.dataset.close()
    dist.all_gather = all_gather
    np.save(f"{out}/rank{rank}.npy", np.concatenate(rows))
    enc = loader.dataset.encoder
    np.save(f"{out}/tokenized{rank}.npy", np.array([enc.tokens_tokenized, enc.exchanges]))
    Path(out, f"exchanges{rank}.json").write_text(json.dumps([dp_rank, exchanges]))


@pytest.mark.slow
def test_ranks_sharing_the_tokenizing_read_exactly_the_one_process_stream(tmp_path):
    """On dp 2 x tp 2, each rank tokenizes about half of the documents, exchanging ids with its
    data-parallel peer only (ranks 0 and 2, 1 and 3: never the tensor-parallel peer that reads
    the same sequences, never the whole world), always on the reader's thread, never on the
    training thread; and together they cut exactly the windows one process cuts alone, over
    several exchanges and epochs."""
    corpus = str(BUILTIN_DATASETS["titanlite_corpus"])
    world, dp, steps = 4, 2, 2500
    alone = _loader("text", corpus, GLOBAL_BATCH, 0, 1)
    reference = _stream([alone], steps)
    assert alone.dataset.epoch >= 1  # the stream wrapped: epochs are covered too
    spawn(_shared_tokenizing, world, corpus, steps, str(tmp_path))
    got = {r: np.load(tmp_path / f"rank{r}.npy").reshape(steps, -1, SEQ + 1) for r in range(world)}
    seen = {r: json.loads((tmp_path / f"exchanges{r}.json").read_text()) for r in range(world)}
    by_dp = {dp_rank: r for r, (dp_rank, _) in seen.items()}  # one rank per dp index
    whole = np.concatenate([got[by_dp[d]] for d in range(dp)], axis=1).reshape(-1, SEQ + 1)
    assert np.array_equal(whole, reference)
    for r in range(world):
        peer = r + 1 if r % 2 == 0 else r - 1  # tp peer: the same sequences
        assert np.array_equal(got[r], got[peer]), r
        dp_rank, exchanges = seen[r]
        assert exchanges, r
        on_main = [e for e in exchanges if e[0]]
        assert not on_main, f"rank {r}: {len(on_main)} exchanges on the training thread"
        groups = {(world_group, tuple(ranks)) for _, world_group, ranks in exchanges}
        assert groups == {(False, (r % 2, r % 2 + 2))}, (r, groups)
    tokenized, counts = zip(*(np.load(tmp_path / f"tokenized{r}.npy") for r in range(world)))
    for group in ((0, 2), (1, 3)):  # each dp group tokenizes the stream once, half each
        # (The groups read ahead on their own: their counts of exchanges may differ.)
        assert counts[group[0]] == counts[group[1]] >= 2, counts
        assert sum(tokenized[r] for r in group) >= reference.size
        assert max(tokenized[r] for r in group) < 0.6 * sum(tokenized[r] for r in group)
