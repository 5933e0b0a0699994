"""How data-parallel ranks share one global stream of windows (both readers use it).

Positions count windows of the global stream from `base`, the position the loader started or
resumed at. Each micro-batch takes the next local_batch_size x dp_size positions; rank r reads
the r-th run of local_batch_size of them. So a step's global batch is the same set of windows
whatever the data-parallel degree, and "windows consumed" at a micro-batch boundary is one number,
the same on every rank. That number is the loader's checkpointed position: DCP keeps one copy of
state that every rank holds, and a run resumed with another data-parallel degree or batch size
continues from it (the new layout's micro-batches start at the new base).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankSplit:
    local_batch_size: int
    dp_rank: int
    dp_size: int
    base: int = 0

    @property
    def chunk(self) -> int:
        """Windows per micro-batch over all data-parallel ranks."""
        return self.local_batch_size * self.dp_size

    def owns(self, pos: int) -> bool:
        return ((pos - self.base) // self.local_batch_size) % self.dp_size == self.dp_rank

    def ends_share(self, pos: int) -> bool:
        """Is `pos` (owned) this rank's last window of its micro-batch?"""
        return (pos - self.base) % self.local_batch_size == self.local_batch_size - 1

    def chunk_end(self, pos: int) -> int:
        """The first position after the micro-batch holding `pos`."""
        return self.base + ((pos - self.base) // self.chunk + 1) * self.chunk

    def position(self, k: int) -> int:
        """This rank's k-th window (from 0) -> its position in the global stream."""
        micro, j = divmod(k, self.local_batch_size)
        return self.base + micro * self.chunk + self.dp_rank * self.local_batch_size + j

    def consumed(self, k: int) -> int:
        """Global windows consumed once this rank has read k windows (k a whole number of
        micro-batches: the loader yields whole micro-batches)."""
        return self.base + (k // self.local_batch_size) * self.chunk
