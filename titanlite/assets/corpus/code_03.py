"""wordstat: a small command line tool that reports word statistics.

Usage examples::

    python wordstat.py notes.txt
    python wordstat.py --top 20 --min-length 4 chapter1.txt chapter2.txt
    cat essay.txt | python wordstat.py -

It prints the number of lines, words and characters, the average word
length, and the most common words, optionally ignoring a list of stop words.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TextIO

WORD_RE = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")

DEFAULT_STOP_WORDS = frozenset(
    "a an and are as at be but by for from has have in is it its of on or "
    "that the this to was were will with".split()
)


@dataclass
class Stats:
    lines: int = 0
    words: int = 0
    chars: int = 0
    letters: int = 0
    counts: Counter[str] = field(default_factory=Counter)

    def update(self, line: str, stop_words: frozenset[str], min_length: int) -> None:
        self.lines += 1
        self.chars += len(line)
        for match in WORD_RE.finditer(line):
            word = match.group().lower()
            self.words += 1
            self.letters += len(word)
            # Stop words still count toward totals; they are only hidden
            # from the frequency table, where they would crowd out the rest.
            if word not in stop_words and len(word) >= min_length:
                self.counts[word] += 1

    def merge(self, other: Stats) -> None:
        self.lines += other.lines
        self.words += other.words
        self.chars += other.chars
        self.letters += other.letters
        self.counts.update(other.counts)

    @property
    def average_word_length(self) -> float:
        return self.letters / self.words if self.words else 0.0


def collect(stream: TextIO, stop_words: frozenset[str], min_length: int) -> Stats:
    stats = Stats()
    for line in stream:
        stats.update(line, stop_words, min_length)
    return stats


def open_inputs(paths: Iterable[str]) -> Iterable[tuple[str, TextIO]]:
    for path in paths:
        if path == "-":
            yield "<stdin>", sys.stdin
        else:
            # errors="replace" keeps one odd byte from aborting a long report.
            with open(path, encoding="utf-8", errors="replace") as handle:
                yield path, handle


def format_report(name: str, stats: Stats, top: int) -> str:
    lines = [
        f"== {name} ==",
        f"lines:      {stats.lines}",
        f"words:      {stats.words}",
        f"characters: {stats.chars}",
        f"avg length: {stats.average_word_length:.2f}",
    ]
    if top > 0 and stats.counts:
        lines.append(f"top {top} words:")
        width = max(len(w) for w, _ in stats.counts.most_common(top))
        for word, count in stats.counts.most_common(top):
            bar = "*" * min(count, 40)
            lines.append(f"  {word:<{width}}  {count:>5}  {bar}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="wordstat", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", default=["-"], help="files to read, '-' for stdin")
    parser.add_argument("--top", type=int, default=10, help="how many frequent words to list")
    parser.add_argument("--min-length", type=int, default=1, help="ignore shorter words in the table")
    parser.add_argument("--keep-stop-words", action="store_true", help="do not filter common words")
    parser.add_argument("--total-only", action="store_true", help="print only the combined report")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    stop_words = frozenset() if args.keep_stop_words else DEFAULT_STOP_WORDS
    total = Stats()
    reports = []
    try:
        for name, stream in open_inputs(args.paths):
            stats = collect(stream, stop_words, args.min_length)
            total.merge(stats)
            if not args.total_only:
                reports.append(format_report(name, stats, args.top))
    except OSError as exc:
        print(f"wordstat: {exc}", file=sys.stderr)
        return 1
    if len(args.paths) > 1 or args.total_only:
        reports.append(format_report("total", total, args.top))
    print("\n\n".join(reports))
    return 0


if __name__ == "__main__":
    sys.exit(main())
