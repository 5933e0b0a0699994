"""Data: tokenizer, datasets and the stateful loader that feeds the trainer.

A dataset path holds either text (.txt/.py/.jsonl/.parquet, tokenized on the fly by
PackedTextDataset) or prepared shards (a manifest.json written by `titanlite.data.prepare`, read
through memory maps by ShardWindowDataset); `open_dataset` tells them apart by what is there.
A mixture's sources are either, each (MixtureWindowDataset).
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from titanlite.data.documents import DatasetError, list_files
from titanlite.data.mixture import Mixture
from titanlite.data.shards import ShardSet, is_prepared
from titanlite.data.tokenizer import Tokenizer, TokenizerError, resolve_tokenizer_path

# The torch-backed loaders are imported on first use, so that the preparation tool and its
# worker processes start without importing torch.
_LAZY = {
    "PackedTextDataset": "titanlite.data.text_dataset",
    "ShardWindowDataset": "titanlite.data.shard_dataset",
    "StatefulDataLoader": "torchdata.stateful_dataloader",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


ASSETS = Path(__file__).resolve().parent.parent / "assets"
# Built-in datasets by `training.dataset` name, used when `training.dataset_path` is unset.
BUILTIN_DATASETS = {"titanlite_corpus": ASSETS / "corpus"}

# What a dataset path resolves to: text files, or prepared shards. (Training may instead read a
# Mixture of such sources, [[data.sources]].)
DataSource = list[Path] | ShardSet


def resolve_dataset_path(dataset: str, dataset_path: str | None) -> Path:
    if dataset_path:
        return Path(dataset_path)
    if dataset in BUILTIN_DATASETS:
        return BUILTIN_DATASETS[dataset]
    raise DatasetError(
        f"training.dataset = {dataset!r} is not built in (built in: "
        f"{', '.join(BUILTIN_DATASETS)}); set training.dataset_path to a local copy of it"
    )


def open_dataset(
    path: Path, tokenizer: Tokenizer, key: str = "training.dataset_path"
) -> DataSource:
    """Prepared shards (checked against the tokenizer) if `path` holds a manifest, else the text
    files under it. DatasetError, naming the path and the fix, if it cannot be trained on."""
    if is_prepared(path):
        shards = ShardSet(path, key)
        shards.check(tokenizer.vocab_size, tokenizer.fingerprint, tokenizer.path)
        return shards
    return list_files(path, key)


def build_dataloader(
    source: DataSource | Mixture,
    tokenizer: Tokenizer,
    *,
    seq_len: int,
    local_batch_size: int,
    dp_rank: int,
    dp_size: int,
    seed: int,
    text_field: str = "text",
    tokenize_groups: Sequence[Any] = (),
    prefetch: bool = True,
    windows_per_step: int = 0,
) -> Any:
    """A torchdata StatefulDataLoader of (inputs, labels) micro-batches for one dp rank.
    `tokenize_groups`: per text stream, in order (a text dataset's one, or each text source's of
    a Mixture, `Mixture.text_sources`), the process group that shares tokenizing it
    (PackedTextDataset); missing ones tokenize alone, prepared shards need none. `prefetch`: the text reader reads and tokenizes on a thread of its own
    (the loader itself has no worker process: the reader's exchange is a collective).
    `windows_per_step`: the global batch, where a mixture's phases start."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from titanlite.data.mixture_dataset import MixtureWindowDataset
    from titanlite.data.shard_dataset import ShardWindowDataset
    from titanlite.data.text_dataset import PackedTextDataset

    groups = list(tokenize_groups)
    dataset: ShardWindowDataset | PackedTextDataset | MixtureWindowDataset
    if isinstance(source, Mixture):
        streams = _mixture_streams(source, tokenizer, seq_len, seed, text_field, groups, prefetch)
        dataset = MixtureWindowDataset(
            source.names,
            streams,
            source.schedule(windows_per_step),
            local_batch_size,
            dp_rank,
            dp_size,
            source.allow_change,
            windows_per_step,
        )
    elif isinstance(source, ShardSet):
        dataset = ShardWindowDataset(source, seq_len, local_batch_size, dp_rank, dp_size, seed)
    else:
        dataset = PackedTextDataset(
            source,
            tokenizer,
            seq_len,
            local_batch_size,
            dp_rank,
            dp_size,
            seed,
            text_field,
            _nth(groups, 0),
            prefetch,
        )
    # torchdata 0.11 calls a torch API that torch now flags as deprecated: noise for users.
    warnings.filterwarnings("ignore", message=".*set_vital.*is deprecated")
    return StatefulDataLoader(dataset, batch_size=local_batch_size, num_workers=0)


def _mixture_streams(
    mixture: Mixture,
    tokenizer: Tokenizer,
    seq_len: int,
    seed: int,
    text_field: str,
    groups: Sequence[Any],
    prefetch: bool,
) -> list[Any]:
    """Each source's windows on one rank: all of a prepared source's (any at once), a text
    source's stream (in order), tokenized with the others of `groups[its index among the text
    sources]`."""
    from titanlite.data.mixture_text import TextWindows
    from titanlite.data.shard_dataset import ShardWindowDataset

    streams: list[Any] = []
    for s, (name, data) in enumerate(zip(mixture.names, mixture.sources)):
        if isinstance(data, ShardSet):
            streams.append(ShardWindowDataset(data, seq_len, 1, 0, 1, seed))
            continue
        group = _nth(groups, mixture.text_sources.index(s))
        limit = mixture.max_repetition[s]
        streams.append(
            TextWindows(name, data, tokenizer, seq_len, seed, text_field, group, prefetch, limit)
        )
    return streams


def _nth(groups: Sequence[Any], i: int) -> Any:
    return groups[i] if i < len(groups) else None


__all__ = [
    "BUILTIN_DATASETS",
    "DataSource",
    "DatasetError",
    "PackedTextDataset",
    "ShardSet",
    "Mixture",
    "ShardWindowDataset",
    "StatefulDataLoader",
    "Tokenizer",
    "TokenizerError",
    "build_dataloader",
    "list_files",
    "open_dataset",
    "resolve_dataset_path",
    "resolve_tokenizer_path",
]
