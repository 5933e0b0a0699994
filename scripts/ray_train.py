"""Train on a Ray cluster with Ray Train (KubeRay, `ray start`, or a local Ray instance).

    python scripts/ray_train.py --config llama_8b.toml --num-workers 16 --use-gpu \\
        --max-failures 3 [--address ADDR] [--section.key value ...]

The config is checked for all the workers first (a mistake is one line, exit 2, Ray not started);
then each Ray Train worker runs the trainer of run_train.sh. See docs/ray.md.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    from titanlite.ray_launch import main

    sys.exit(main(sys.argv[1:]))
