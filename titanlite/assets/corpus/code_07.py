"""Prefix search with a trie, as used by a simple autocomplete box.

Each node stores its children in a dict keyed by character, plus a count of
how often a word ending at that node was inserted. Suggestions are returned
by frequency, so words the user picks often rise to the top.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field


@dataclass
class TrieNode:
    children: dict[str, TrieNode] = field(default_factory=dict)
    count: int = 0  # > 0 means a word ends here


class Trie:
    def __init__(self, words: Iterable[str] = ()) -> None:
        self.root = TrieNode()
        self._size = 0
        for word in words:
            self.insert(word)

    def insert(self, word: str, times: int = 1) -> None:
        node = self.root
        for ch in word:
            node = node.children.setdefault(ch, TrieNode())
        if node.count == 0:
            self._size += 1
        node.count += times

    def _find(self, prefix: str) -> TrieNode | None:
        node = self.root
        for ch in prefix:
            node = node.children.get(ch)
            if node is None:
                return None
        return node

    def __contains__(self, word: str) -> bool:
        node = self._find(word)
        return node is not None and node.count > 0

    def __len__(self) -> int:
        return self._size

    def remove(self, word: str) -> bool:
        """Delete a word and prune branches that no longer lead anywhere."""
        path: list[tuple[TrieNode, str]] = []
        node = self.root
        for ch in word:
            child = node.children.get(ch)
            if child is None:
                return False
            path.append((node, ch))
            node = child
        if node.count == 0:
            return False
        node.count = 0
        self._size -= 1
        # Walk back up, dropping empty leaves so memory does not grow forever.
        for parent, ch in reversed(path):
            child = parent.children[ch]
            if child.count or child.children:
                break
            del parent.children[ch]
        return True

    def _walk(self, node: TrieNode, prefix: str) -> Iterator[tuple[str, int]]:
        # An explicit stack avoids hitting the recursion limit on long words.
        stack = [(node, prefix)]
        while stack:
            current, text = stack.pop()
            if current.count:
                yield text, current.count
            for ch in sorted(current.children, reverse=True):
                stack.append((current.children[ch], text + ch))

    def words(self, prefix: str = "") -> list[str]:
        node = self._find(prefix)
        return [] if node is None else [w for w, _ in self._walk(node, prefix)]

    def suggest(self, prefix: str, limit: int = 5) -> list[str]:
        """Most frequent completions first; ties broken alphabetically."""
        node = self._find(prefix)
        if node is None:
            return []
        best = heapq.nsmallest(limit, self._walk(node, prefix), key=lambda wc: (-wc[1], wc[0]))
        return [word for word, _ in best]

    def longest_common_prefix(self) -> str:
        node, prefix = self.root, ""
        while len(node.children) == 1 and node.count == 0:
            ch, node = next(iter(node.children.items()))
            prefix += ch
        return prefix


def tokenize(text: str) -> Iterator[str]:
    word = []
    for ch in text.lower():
        if ch.isalpha() or ch == "'":
            word.append(ch)
        elif word:
            yield "".join(word)
            word = []
    if word:
        yield "".join(word)


if __name__ == "__main__":
    text = (
        "the garden gate was green and the greenhouse glowed; "
        "grandmother grew grapes, greens and geraniums in the garden"
    )
    trie = Trie(tokenize(text))
    print(f"{len(trie)} distinct words")
    for prefix in ["g", "gr", "gre", "the", "x"]:
        print(f"{prefix!r:>6}: {trie.suggest(prefix, limit=4)}")
    trie.remove("greenhouse")
    print("after removal:", trie.words("green"))
    print("common prefix of {'interview', 'internet'}:", Trie(["interview", "internet"]).longest_common_prefix())
