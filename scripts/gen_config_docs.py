"""Write docs/config.md from the config schema, so the reference never drifts from the code.

python scripts/gen_config_docs.py            # rewrite docs/config.md
python scripts/gen_config_docs.py --check    # exit 1 if it is out of date (a test runs this)
"""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

from titanlite.config.loader import _default
from titanlite.config.schema import (
    FIXED_KEYS,
    IGNORED_KEYS,
    RENAMED_KEYS,
    RENAMED_SECTIONS,
    UNIMPLEMENTED_SECTIONS,
    JobConfig,
)
from titanlite.core.arguments import ArgumentParser

DOC = Path(__file__).resolve().parent.parent / "docs" / "config.md"

HEADER = """# Configuration reference

Generated from `titanlite/config/schema.py` by `scripts/gen_config_docs.py`; do not edit by hand.

Set keys in a TOML file (`[section]` then `key = value`) or on the command line
(`--section.key value`, `--section.key=value`, bare `--section.flag` = true, lists
comma-separated). Precedence: command line > TOML > the defaults below. Names follow
TorchTitan's TOML schema where the concept is the same. Keys marked *not yet* are accepted only at
their default (so TorchTitan files load) and refused with a clear error otherwise.
"""


def _number(value: float) -> str:
    # Powers of two and ten read better as such than as 16-digit integers.
    if isinstance(value, int) and value >= 2**16:
        for base in (2, 10):
            exp = round(math.log(value, base))
            for candidate in (exp, exp + 1):
                if base**candidate == value:
                    return f"{base}^{candidate}"
                if base**candidate - 1 == value:
                    return f"{base}^{candidate}-1"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _range(meta: dict) -> str:
    low, high = meta.get("min"), meta.get("max")
    if low is None and high is None:
        return ""
    shown = (
        f"{_number(low) if low is not None else ''}..{_number(high) if high is not None else ''}"
    )
    if meta.get("sentinel"):
        value, meaning = meta["sentinel"]
        shown += f"; {value} = {meaning}"
    return f" (range {shown})"


def render() -> str:
    out = [HEADER]
    for section in dataclasses.fields(JobConfig):
        out += [f"\n## [{section.name}]\n", "| key | default | meaning |", "|---|---|---|"]
        for f in dataclasses.fields(section.default_factory()):
            meta = dict(f.metadata)
            note = meta.get("help", "")
            if meta.get("choices"):
                note += f" (one of: {', '.join(repr(c) for c in meta['choices'])})"
            note += _range(meta)
            if meta.get("unsupported"):
                note = (note + " " if note else "") + "*not yet*"
            out.append(f"| `{f.name}` | `{_default(f)!r}` | {note} |")
    out.append("\n## Sections accepted only while switched off\n")
    for name, keys in UNIMPLEMENTED_SECTIONS.items():
        shown = ", ".join(f"`{k} = {v!r}`" for k, v in keys.items()) or "any content"
        out.append(f"- `[{name}]`: {shown}")
    out.append("\n## TorchTitan spellings accepted (with a one-line note)\n")
    for (sec, key), (new_sec, new_key) in RENAMED_KEYS.items():
        out.append(f"- `[{sec}] {key}` is `[{new_sec}] {new_key}`")
    for old_name, new_name in RENAMED_SECTIONS.items():
        out.append(f"- `[{old_name}]` is `[{new_name}]`")
    for (sec, key), value in FIXED_KEYS.items():
        out.append(f"- `[{sec}] {key}`: accepted only as `{value!r}`")
    for (sec, key), why in IGNORED_KEYS.items():
        out.append(f"- `[{sec}] {key}`: ignored; {why}")
    return "\n".join(out) + "\n"


def main() -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not DOC.exists() or DOC.read_text() != text:
            print(f"{DOC} is out of date: run python scripts/gen_config_docs.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
