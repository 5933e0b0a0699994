"""A checkpoint saved with torchao's FSDP float8 weights loads where torchao is not installed:
through load_full_state_dict and as the trainer's starting point (issue 27 item 2)."""

import pytest
from helpers import ROOT, check, run_python

pytest.importorskip("torchao")

WORKER = str(ROOT / "tests" / "distributed" / "float8_checkpoint_worker.py")
# scripts/: the save is the GPU check's (scripts/gpu_check_workers.py).
PATH = f"{ROOT / 'tests' / 'distributed'}:{ROOT / 'tests'}:{ROOT}:{ROOT / 'scripts'}"


def test_float8_fsdp_checkpoint_loads_without_torchao(tmp_path):
    check(run_python([WORKER, "save", str(tmp_path)], timeout=300, PYTHONPATH=PATH))
    loaded = check(run_python([WORKER, "load", str(tmp_path)], timeout=300, PYTHONPATH=PATH))
    assert "saved as torchao weights) without torchao" in loaded.stdout
