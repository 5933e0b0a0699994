"""Tokenizing the text reader's global stream once across a group of processes, not once per
process.

Every rank of a run reads the same global stream of documents (that is what makes the global
batch independent of the layout, and the loader's state one number every rank shares). Left
alone, every rank would also tokenize all of it: at data-parallel degree 64, 64 times the work
of the rank's own share, on the training thread. Instead, each batch of documents (the same on
every rank, since all of them read the same records) is cut into one contiguous part per rank of
the group, by characters; each rank tokenizes its part, and the token ids are all-gathered in
rank order. Documents are tokenized one by one (framed BOS ... EOS), so the concatenation is
exactly the stream one process would produce, whatever the group's size: nothing about windows,
resume or resharding changes. What every rank still does is read and parse every record (cheap
next to tokenizing) and receive the stream's ids (4 bytes a token).

The group's ranks must call `encode` in the same order with the same texts; the reader does,
because every rank cuts the same windows from the same stream.

The group is one data-parallel group (`exchange_group`): the ranks that read different sequences
and share every other coordinate (tensor, context, pipeline). It holds one rank per
data-parallel index, so together its ranks tokenize the stream once and each its own share;
ranks that read the same sequences (a tensor-parallel group) are in different exchange groups
and never wait for each other. It is a gloo group of its own, not the default one nor a mesh's:
the reader's thread exchanges on it while the training thread runs its collectives.
"""

from __future__ import annotations

import bisect
import itertools

import torch
import torch.distributed as dist

from titanlite.data.tokenizer import Tokenizer


def split_by_chars(lengths: list[int], parts: int) -> list[int]:
    """Boundaries b_0 = 0 <= b_1 <= ... <= b_parts = len(lengths): part k is documents
    [b_k, b_k+1), contiguous, with about the same number of characters in each."""
    ends = list(itertools.accumulate(lengths))
    total = ends[-1] if ends else 0
    cuts = [bisect.bisect_left(ends, total * k / parts) for k in range(1, parts)]
    return [0, *cuts, len(lengths)]


class SplitTokenizer:
    """`encode(texts)` -> the flat token ids of the documents, tokenized in parts across
    `group` (None: this process alone tokenizes everything)."""

    def __init__(self, tokenizer: Tokenizer, group: dist.ProcessGroup | None = None):
        self.tokenizer = tokenizer
        self.group = group
        self.size = dist.get_world_size(group) if group is not None else 1
        self.rank = dist.get_rank(group) if group is not None else 0
        self.tokens_tokenized = 0  # by this process: what the split saves is measured with it
        self.exchanges = 0

    def _encode_here(self, texts: list[str]) -> list[int]:
        ids = [t for doc in self.tokenizer.encode_documents(texts) for t in doc] if texts else []
        self.tokens_tokenized += len(ids)
        return ids

    def encode(self, texts: list[str]) -> list[int]:
        if self.size == 1:
            return self._encode_here(texts)
        bounds = split_by_chars([len(t) for t in texts], self.size)
        mine = torch.tensor(
            self._encode_here(texts[bounds[self.rank] : bounds[self.rank + 1]]),
            dtype=torch.int32,
        )
        # CPU tensors: gloo on a CPU run, and the default group's gloo side on a GPU run.
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.size)]
        dist.all_gather(sizes, torch.tensor([mine.numel()]), group=self.group)
        longest = int(max(s.item() for s in sizes))
        if longest == 0:  # the same answer on every rank, so all of them skip the exchange
            return []
        padded = torch.zeros(longest, dtype=torch.int32)
        padded[: mine.numel()] = mine
        parts = [torch.empty(longest, dtype=torch.int32) for _ in range(self.size)]
        dist.all_gather(parts, padded, group=self.group)
        self.exchanges += 1
        return torch.cat([p[: int(s.item())] for p, s in zip(parts, sizes)]).tolist()


def exchange_group(dp_groups: list[list[int]]) -> dist.ProcessGroup | None:
    """This rank's gloo group among `dp_groups` (the global ranks of every data-parallel group:
    every rank passes the same lists, and creates all of them, as torch requires); None when
    there are no data-parallel peers to share with."""
    if not dp_groups or len(dp_groups[0]) < 2:
        return None
    mine, _ = dist.new_subgroups_by_enumeration(
        dp_groups, backend="gloo", group_desc="text_reader_exchange"
    )
    return mine
