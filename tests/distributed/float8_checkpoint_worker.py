"""A float8 checkpoint written where torchao's FSDP float8 weights exist, read where torchao
does not (tests/distributed/test_float8_checkpoint.py).

    python float8_checkpoint_worker.py save DUMP   # debug model, float8 + FSDP float8 all-gather
    python float8_checkpoint_worker.py load DUMP   # torchao made unimportable first

`save` builds the trainer's debug model, converts it to float8 with the FSDP float8 all-gather
and shards it with fully_shard on a one-rank gloo mesh (so each weight is a DTensor around
torchao's WeightWithDynamicFloat8CastTensor, as in a real FSDP float8 run; gloo cannot run the
float8 all-gather itself, so no step is taken: the optimizer state comes from one AdamW step on
unit gradients), then saves synchronously through titanlite's CheckpointManager. It writes the
values it saved to DUMP/expected.pt. `load` reads the checkpoint with load_full_state_dict and
then starts a one-step trainer from it (checkpoint.initial_load_path), in one process that
could not import torchao.
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
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torchdata.stateful_dataloader import StatefulDataLoader

    from parallelisms.float8 import Float8Options, convert_to_float8
    from titanlite.components.checkpoint.manager import CheckpointManager
    from titanlite.config.schema import Checkpoint
    from titanlite.families import get_family
    from titanlite.preflight import checks
    from titanlite.trainer.trainer import TrainState

    _one_rank_group()
    job, pre = checks.run(TRAIN, 1)
    torch.manual_seed(0)
    model = get_family(job.model.name).model.model_cls(pre.model_args)
    convert_to_float8(model, Float8Options(fsdp_float8_all_gather=True))
    mesh = init_device_mesh("cpu", (1,))
    for block in model.layers.values():
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    f8 = {n for n, p in model.named_parameters() if type(p._local_tensor).__name__ != "Tensor"}
    assert any(
        "WeightWithDynamicFloat8CastTensor" in type(p._local_tensor).__name__
        for p in model.parameters()
    ), f8
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()
    manager = CheckpointManager(
        Checkpoint(enable_checkpoint=True),
        dump,
        model=model,
        optimizer=optimizer,
        lr_scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
        dataloader=StatefulDataLoader(list(range(8))),
        train_state=TrainState(),
        total_steps=1,
    )
    manager.save(1, config_hash="float8", force_sync=True)
    manager.close()
    # What each weight holds, read from the torchao wrapper itself (world size 1: the shard is
    # the whole tensor).
    values = {
        n: getattr(p._local_tensor, "_tensor", p._local_tensor).detach().clone()
        for n, p in model.named_parameters()
    }
    torch.save({"subclassed": sorted(f8), "model": values}, dump / "expected.pt")


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
