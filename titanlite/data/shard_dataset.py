"""Prepared shards -> token windows, in a shuffled order that any rank computes on its own.

The shards' token stream is cut into W = tokens // (seq_len + 1) windows. Epoch e reads them in
the order of a pseudo-random permutation of range(W) drawn from (seed, e); the global window
stream is epoch 0's order, then epoch 1's, and so on. Position p of that stream is window
order_{p // W}(p % W); ranks share positions by `RankSplit`. The permutation is a Feistel network
evaluated per index, so neither the corpus nor an index of its windows is ever held in memory,
and jumping to any position (a resume) costs nothing.

The loader's state is the number of windows consumed by all ranks together: a resumed run with
another data-parallel degree or global batch size continues the same stream from there.

Windows carry no document boundaries besides their tokens: every document is framed BOS ... EOS,
and block_causal attention reads the boundaries from the BOS tokens (docs/data.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset

from titanlite.data.documents import DatasetError
from titanlite.data.rank_split import RankSplit
from titanlite.data.shards import ShardSet

_M64 = (1 << 64) - 1
_NOT_RESUMABLE = (
    "resume with the saving run's, or start the loader afresh with "
    "--checkpoint.exclude_from_loading dataloader"
)


def _mix(x: int) -> int:
    """splitmix64's finalizer: a cheap, well-spread 64-bit hash."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


class WindowOrder:
    """A pseudo-random permutation of range(n) from (seed, epoch), evaluated one index at a time:
    a 4-round Feistel network on the smallest even-bit domain >= n (< 4n), cycle-walking
    values that fall outside range(n) back in (still a bijection on range(n))."""

    def __init__(self, n: int, seed: int, epoch: int):
        bits = max(2, (n - 1).bit_length())
        self.n, self.half = n, (bits + 1) // 2
        self.mask = (1 << self.half) - 1
        digest = hashlib.sha256(f"titanlite-windows:{seed}:{epoch}".encode()).digest()
        self.keys = [int.from_bytes(digest[8 * i : 8 * i + 8], "little") for i in range(4)]

    def __call__(self, i: int) -> int:
        while True:
            left, right = i >> self.half, i & self.mask
            for key in self.keys:
                left, right = right, left ^ (_mix(right ^ key) & self.mask)
            i = (left << self.half) | right
            if i < self.n:
                return i


class ShardWindowDataset(IterableDataset):
    """Windows of seq_len + 1 tokens for one data-parallel rank; stateful for exact resume."""

    def __init__(
        self,
        shards: ShardSet,
        seq_len: int,
        local_batch_size: int,
        dp_rank: int,
        dp_size: int,
        seed: int = 0,
    ):
        self.shards, self.seq_len, self.seed = shards, seq_len, seed
        self.windows = shards.num_windows(seq_len)
        if self.windows == 0:
            raise DatasetError(
                f"{shards.key}: {shards.manifest_file} holds {shards.total_tokens} tokens, fewer "
                f"than one window of seq_len + 1 = {seq_len + 1}; prepare more data"
            )
        self.local_batch_size, self.dp_rank, self.dp_size = local_batch_size, dp_rank, dp_size
        self.split = RankSplit(local_batch_size, dp_rank, dp_size)
        self.read = 0  # windows this rank has yielded since the split's base
        self._order: tuple[int, WindowOrder] | None = None

    def window_at(self, pos: int) -> np.ndarray:
        """The tokens at position `pos` of the global window stream."""
        epoch, j = divmod(pos, self.windows)
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, WindowOrder(self.windows, self.seed, epoch))
        return self.shards.window(self._order[1](j), self.seq_len)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            t = torch.from_numpy(self.window_at(self.split.position(self.read)).astype(np.int64))
            self.read += 1
            yield t[:-1], t[1:]

    def state_dict(self) -> dict[str, Any]:
        consumed = self.split.consumed(self.read)
        # Between micro-batches: the same on every rank (DCP keeps one copy), and layout-free.
        return {
            "consumed": consumed,
            "partial": self.read % self.local_batch_size,
            "epoch": consumed // self.windows,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "windows_per_epoch": self.windows,
            "dataset": self.shards.fingerprint,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        where = "the checkpoint's data loader position"
        if state["dataset"] != self.shards.fingerprint:
            raise DatasetError(
                f"{where} is in another prepared dataset (fingerprint "
                f"{state['dataset']}, {self.shards.manifest_file} is "
                f"{self.shards.fingerprint}): {_NOT_RESUMABLE}"
            )
        if state["seq_len"] != self.seq_len:
            raise DatasetError(
                f"{where} counts windows of training.seq_len = {state['seq_len']}, "
                f"this run has {self.seq_len}: {_NOT_RESUMABLE}"
            )
        # The saving run's seed keeps the stream the same even if this run drew another.
        self.seed, self._order = int(state["seed"]), None
        self.split = RankSplit(
            self.local_batch_size, self.dp_rank, self.dp_size, int(state["consumed"])
        )
        # Windows read of an unfinished micro-batch (never, in training): exact with the saving
        # layout only.
        self.read = int(state.get("partial", 0))
