"""A float8 checkpoint written where torchao's FSDP float8 weights exist, read where torchao
does not (tests/distributed/test_float8_checkpoint.py).

    python float8_checkpoint_worker.py save DUMP   # debug model, float8 + FSDP float8 all-gather
    python float8_checkpoint_worker.py load DUMP   # torchao made unimportable first

`save` is scripts/gpu_check_workers.py's (the GPU check (k) runs the same code): the trainer's
debug model converted to float8 with the FSDP float8 all-gather and sharded with titanlite's
apply_fsdp on a one-rank gloo mesh (so each weight is a DTensor around torchao's
WeightWithDynamicFloat8CastTensor, as in a real FSDP float8 run; gloo cannot run the float8
all-gather itself, so no step is taken: the optimizer state comes from one AdamW step on unit
gradients), saved synchronously through titanlite's CheckpointManager, with the values it saved
in DUMP/expected.pt. `load` reads the checkpoint with load_full_state_dict and then starts a
one-step trainer from it (checkpoint.initial_load_path), in one process that could not import
torchao.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from helpers import DEBUG_CONFIG, ONE_STEP, free_port

TRAIN = [
    "--config",
    str(DEBUG_CONFIG),
    *ONE_STEP,
    "--training.mixed_precision_param",
    "float32",
]


def _one_rank_group() -> None:
    import torch.distributed as dist

    os.environ.update(
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
    )
    dist.init_process_group("gloo")


def save(dump: Path) -> None:
    import json

    from gpu_check_workers import float8_save

    float8_save(dump, TRAIN)
    kinds = json.loads((dump / "saved.json").read_text())["kinds"]
    assert "WeightWithDynamicFloat8CastTensor" in kinds, kinds


class _NoTorchao:
    """A meta path finder that makes torchao unimportable, as on a machine without it."""

    def find_spec(self, name, path=None, target=None):
        if name == "torchao" or name.startswith("torchao."):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)")
        return None


def load(dump: Path) -> None:
    sys.meta_path.insert(0, _NoTorchao())
    import torch

    from titanlite import cli
    from titanlite.components.checkpoint.storage import load_full_state_dict
    from titanlite.core.logging import init_logger, logger

    expected = torch.load(dump / "expected.pt", weights_only=True)
    assert expected["subclassed"], "the save held no torchao weight"
    path = dump / "checkpoint" / "step-1"
    sd = load_full_state_dict(path)
    assert set(sd) >= {"model", "optimizer", "train_state"}, sorted(sd)
    for name, want in expected["model"].items():
        got = sd["model"][name]
        assert type(got) is torch.Tensor and torch.equal(got, want), name
    _one_rank_group()
    init_logger()
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    resumed = ["--checkpoint.enable_checkpoint", "--checkpoint.initial_load_path", str(path)]
    assert cli.main([*TRAIN, *resumed, "--job.dump_folder", str(dump / "resumed")]) == 0
    assert f"loaded model from {path}" in " ".join(said), said
    assert "torchao" not in sys.modules
    print(
        f"loaded {len(expected['model'])} tensors ({len(expected['subclassed'])} saved as torchao weights) without torchao"
    )


if __name__ == "__main__":
    {"save": save, "load": load}[sys.argv[1]](Path(sys.argv[2]))
