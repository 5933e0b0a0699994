"""`python -m titanlite.dry_run --config PATH [--dry-run.world_size N] [...]`: plan a launch (layout,
memory, FLOPs) in one process, without training; what `./run_train.sh --dry-run` runs. The
planning itself lives in titanlite.planning."""

from __future__ import annotations

import sys

from titanlite.planning.dry_run import main

if __name__ == "__main__":
    sys.exit(main())
