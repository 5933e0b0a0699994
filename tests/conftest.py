import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

# Compiled graphs (Inductor's FX graph and AOTAutograd caches) in one folder that every process
# of the session inherits and that outlives it on a machine that keeps its home folder: a graph
# compiled once (the same block under another layout, another test, an earlier CI run) is read
# back, not compiled again. Under tensor and context parallel only Inductor's FX graph cache is
# used (parallelisms/compile.py).
os.environ.setdefault(
    "TORCHINDUCTOR_CACHE_DIR",
    str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "titanlite" / "inductor"),
)

# Inductor compiles in the compiling process: with the default (one compile worker per core) every
# process that compiles starts a pool of worker processes that import torch, which on 2 cores
# costs more than it overlaps (measured: 52 s -> 44 s for the memory-budget AC test, cold cache).
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

# Each top folder of tests/ is a tier: `./run_tests.sh -m unit` (or multirank, launcher,
# cluster) runs one of them.
TIERS = {"unit": "unit", "distributed": "multirank", "e2e": "launcher", "slurm": "cluster"}


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        folder = Path(item.fspath).resolve().relative_to(ROOT / "tests").parts[0]
        item.add_marker(TIERS[folder])


@pytest.fixture(scope="session")
def two_rank_reference(tmp_path_factory) -> dict[int, float]:
    """Losses of an uninterrupted 2-process single-node run of helpers.SHORT_RUN."""
    from helpers import SHORT_RUN, check, losses_by_step, torchrun

    folder = tmp_path_factory.mktemp("two_rank_reference")
    check(
        torchrun(
            2,
            ["-m", "titanlite.train"],
            [*SHORT_RUN, "--job.dump_folder", str(folder), "--checkpoint.interval", "100"],
            timeout=300,
        )
    )
    return losses_by_step(folder)
