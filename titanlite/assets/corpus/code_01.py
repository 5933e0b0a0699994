"""A small least-recently-used (LRU) cache built from scratch.

Python already ships ``functools.lru_cache``, but building one by hand is a
good exercise: it combines a hash map for O(1) lookup with a doubly linked
list that remembers the order in which keys were used.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass
class _Node(Generic[K, V]):
    key: K
    value: V
    prev: _Node[K, V] | None = field(default=None, repr=False)
    next: _Node[K, V] | None = field(default=None, repr=False)


class LRUCache(Generic[K, V]):
    """Map-like container that evicts the least recently used entry.

    The list is kept between two sentinel nodes so that insertion and removal
    never need to special-case an empty list or the ends of the list.
    """

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self.capacity = capacity
        self._index: dict[K, _Node[K, V]] = {}
        # Sentinels: head.next is the most recent, tail.prev the oldest.
        self._head: _Node = _Node(None, None)  # type: ignore[arg-type]
        self._tail: _Node = _Node(None, None)  # type: ignore[arg-type]
        self._head.next = self._tail
        self._tail.prev = self._head
        self.hits = 0
        self.misses = 0

    # -- linked list helpers -------------------------------------------------
    def _unlink(self, node: _Node[K, V]) -> None:
        assert node.prev is not None and node.next is not None
        node.prev.next = node.next
        node.next.prev = node.prev
        node.prev = node.next = None

    def _push_front(self, node: _Node[K, V]) -> None:
        first = self._head.next
        assert first is not None
        node.prev = self._head
        node.next = first
        self._head.next = node
        first.prev = node

    # -- public API ------------------------------------------------------------
    def get(self, key: K, default: V | None = None) -> V | None:
        """Return the cached value and mark the key as recently used."""
        node = self._index.get(key)
        if node is None:
            self.misses += 1
            return default
        self.hits += 1
        self._unlink(node)
        self._push_front(node)
        return node.value

    def put(self, key: K, value: V) -> None:
        """Insert or update a key, evicting the oldest entry if needed."""
        node = self._index.get(key)
        if node is not None:
            node.value = value
            self._unlink(node)
            self._push_front(node)
            return
        if len(self._index) >= self.capacity:
            oldest = self._tail.prev
            assert oldest is not None and oldest is not self._head
            self._unlink(oldest)
            del self._index[oldest.key]
        node = _Node(key, value)
        self._index[key] = node
        self._push_front(node)

    def __contains__(self, key: object) -> bool:
        # Membership tests deliberately do not count as a "use".
        return key in self._index

    def __len__(self) -> int:
        return len(self._index)

    def __iter__(self) -> Iterator[K]:
        """Iterate from most to least recently used."""
        node = self._head.next
        while node is not None and node is not self._tail:
            yield node.key
            node = node.next

    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def __repr__(self) -> str:
        items = ", ".join(f"{k!r}: {self._index[k].value!r}" for k in self)
        return f"LRUCache(capacity={self.capacity}, {{{items}}})"


def slow_square(n: int, cache: LRUCache[int, int]) -> int:
    """Pretend to do expensive work, consulting the cache first."""
    cached = cache.get(n)
    if cached is not None:
        return cached
    result = sum(n for _ in range(n))  # deliberately wasteful
    cache.put(n, result)
    return result


if __name__ == "__main__":
    cache: LRUCache[int, int] = LRUCache(capacity=3)
    for n in [1, 2, 3, 1, 4, 2, 5, 1, 1, 3]:
        slow_square(n, cache)
    print(cache)
    print(f"hits={cache.hits} misses={cache.misses} rate={cache.hit_rate():.2f}")
