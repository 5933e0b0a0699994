"""Data: tokenizer, datasets and the stateful loader that feeds the trainer."""

from __future__ import annotations

import warnings
from pathlib import Path

from torchdata.stateful_dataloader import StatefulDataLoader

from titanlite.data.text_dataset import DatasetError, PackedTextDataset, list_files
from titanlite.data.tokenizer import Tokenizer, TokenizerError, resolve_tokenizer_path

ASSETS = Path(__file__).resolve().parent.parent / "assets"
# Built-in datasets by `training.dataset` name, used when `training.dataset_path` is unset.
BUILTIN_DATASETS = {"titanlite_corpus": ASSETS / "corpus"}


def resolve_dataset_path(dataset: str, dataset_path: str | None) -> Path:
    if dataset_path:
        return Path(dataset_path)
    if dataset in BUILTIN_DATASETS:
        return BUILTIN_DATASETS[dataset]
    raise DatasetError(
        f"training.dataset = {dataset!r} is not built in (built in: "
        f"{', '.join(BUILTIN_DATASETS)}); set training.dataset_path to a local copy of it"
    )


def build_dataloader(files: list[Path], tokenizer: Tokenizer, *, seq_len: int,
                     local_batch_size: int, dp_rank: int, dp_size: int, seed: int,
                     text_field: str = "text") -> StatefulDataLoader:
    dataset = PackedTextDataset(files, tokenizer, seq_len, local_batch_size, dp_rank, dp_size,
                                seed, text_field)
    # torchdata 0.11 calls a torch API that torch now flags as deprecated: noise for users.
    warnings.filterwarnings("ignore", message=".*set_vital.*is deprecated")
    return StatefulDataLoader(dataset, batch_size=local_batch_size, num_workers=0)


__all__ = [
    "BUILTIN_DATASETS", "DatasetError", "PackedTextDataset", "StatefulDataLoader", "Tokenizer",
    "TokenizerError", "build_dataloader", "list_files", "resolve_dataset_path",
    "resolve_tokenizer_path",
]
