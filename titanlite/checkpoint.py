"""`python -m titanlite.checkpoint verify PATH`: check a checkpoint against its manifest (every
file there at its size and CRC32) and that its `.metadata` is DCP metadata (read by the
restricted unpickler, so a crafted one is named, never run), and print what it holds; exit 1
with the problems otherwise."""

from __future__ import annotations

import sys
from pathlib import Path

from titanlite.components.checkpoint.folder import CheckpointError
from titanlite.components.checkpoint.storage import (
    ManifestError,
    read_manifest,
    read_metadata,
    verify,
)
from titanlite.core.errors import USER_ERROR, report


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "verify":
        print("usage: python -m titanlite.checkpoint verify PATH", file=sys.stderr)
        return USER_ERROR
    path = Path(argv[1])
    try:
        read_manifest(path)
    except ManifestError as e:  # nothing to verify against: the user's to fix, in one line
        return report(e)
    except CheckpointError:
        pass  # no folder, no manifest: listed as problems below
    problems = verify(path)
    if not problems:
        try:
            read_metadata(path)
        except CheckpointError as e:
            problems = [str(e)]
    if problems:
        print(f"{path}: {len(problems)} problem(s)")
        for p in problems:
            print(f"  - {p}")
        return 1
    manifest = read_manifest(path)
    total = sum(r["size"] for r in manifest["files"].values())
    print(
        f"{path}: OK (step {manifest.get('step', '?')}, {len(manifest['files'])} files, "
        f"{total / 2**20:.1f} MiB, keys {', '.join(map(str, manifest.get('keys', [])))}, "
        f"torch {manifest.get('torch_version', '?')})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
