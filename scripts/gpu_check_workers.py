"""The checks of scripts/gpu_check.py that need a fresh process: a one-rank process group of
their own (NCCL on CUDA, gloo on CPU), or a process that cannot import torchao.

    python scripts/gpu_check_workers.py fsdp OUT.json -- TRAIN ARGS          # check (i)
    python scripts/gpu_check_workers.py float8-save DUMP -- TRAIN ARGS       # check (k), save
    python scripts/gpu_check_workers.py float8-load DUMP -- TRAIN ARGS       # check (k), load

TRAIN ARGS are the trainer's (the debug model's config); each worker writes what it found as
JSON and prints one line. Run as files from a checkout: the checkout's root is put on the path,
nothing needs installing.
"""

from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FSDP_STEPS = 2
# One rank: FSDP's all-gather and reduce-scatter copy, so the sharded model computes what the
# plain one does; the bound leaves room for CUDA's atomics reordering float32 sums.
FSDP_REL_BOUND = 1e-5
# bf16 parameters (the FSDP policy of a real run) against float32: the first loss only.
FSDP_BF16_LOSS_BOUND = 2e-2


def _build(argv: list[str], device, float8=None):
    """The trainer's model for `argv` on the meta device (float8-converted when `float8` holds
    options), as the trainer builds it before parallelizing."""
    import torch

    from titanlite.families import get_family
    from titanlite.preflight import checks

    job, pre = checks.run(argv, 1)
    with torch.device("meta"):
        model = get_family(job.model.name).model.model_cls(pre.model_args)
    if float8 is not None:
        from parallelisms.float8 import convert_to_float8

        convert_to_float8(model, float8)
    return job, pre, model


def _materialize(model, device) -> None:
    model.to_empty(device=device)
    model.init_weights(0)


def _batch(model, device, batch: int = 2):
    """Token windows with documents starting inside them (the BOS id every few tokens)."""
    import torch

    args = model.args
    g = torch.Generator().manual_seed(0)
    seq = min(args.max_seq_len, 128)
    ids = torch.randint(3, args.vocab_size, (batch, seq + 1), generator=g)
    ids[:, :: max(seq // 5, 2)] = args.bos_id
    return ids[:, :-1].to(device), ids[:, 1:].to(device)


def _step(model, optimizer, inputs, targets) -> tuple[float, float]:
    """One training step; (loss, gradient norm before clipping)."""
    import torch
    import torch.nn.functional as F

    logits = model(inputs)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    optimizer.step()
    optimizer.zero_grad()
    return loss.item(), norm.item()


def _worst(values) -> float:
    """The largest value, NaN if any is (max() keeps whichever comes first)."""
    return max(values, key=lambda v: (math.isnan(v), v))


def _full(t):
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().float().cpu()


def _communicator(mesh, device) -> str:
    """A collective on the default group and a DTensor redistribution on the mesh: the first
    collective is what creates an NCCL communicator."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    x = torch.arange(8, dtype=torch.float32, device=device)
    dist.all_reduce(x)
    d = distribute_tensor(x.view(4, 2), mesh, [Shard(0)]).redistribute(mesh, [Replicate()])
    if not torch.equal(d.full_tensor().cpu(), torch.arange(8.0).view(4, 2)):
        raise RuntimeError(f"DTensor redistribute gave {d.full_tensor().tolist()}")
    return dist.get_backend()


def fsdp(out_json: Path, argv: list[str]) -> None:
    """(i) FSDP2 (titanlite's apply_fsdp: embedding, blocks, norm+head, root) on a one-rank mesh
    of the run's device against the same model unsharded: FSDP_STEPS steps of AdamW with
    clipping, every loss, gradient norm and final parameter compared; then bf16 parameters."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from parallelisms.fsdp import apply_fsdp
    from titanlite.core import distributed

    device = distributed.init(300)
    mesh = init_device_mesh(device.type, (1,), mesh_dim_names=("dp_shard",))
    backend = _communicator(mesh, device)
    _, _, plain = _build(argv, device)
    _materialize(plain, device)
    inputs, targets = _batch(plain, device)
    runs = {}
    for name, dtype in (("plain", None), ("fsdp", torch.float32), ("fsdp_bf16", torch.bfloat16)):
        model = copy.deepcopy(plain)
        if dtype is not None:
            units = dict(first=[model.tok_embeddings], last=[model.norm, model.output])
            blocks = list(model.layers.values())
            apply_fsdp(model, blocks, mesh, param_dtype=dtype, reduce_dtype=torch.float32, **units)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        steps = [_step(model, optimizer, inputs, targets) for _ in range(FSDP_STEPS)]
        runs[name] = {
            "steps": steps,
            "dtensors": sum(isinstance(p, DTensor) for p in model.parameters()),
            "params": {n: _full(p) for n, p in model.named_parameters()},
        }
    want, got = runs["plain"], runs["fsdp"]
    param_rel = _worst(
        ((got["params"][n] - w).norm() / w.norm().clamp_min(1e-30)).item()
        for n, w in want["params"].items()
    )
    step_rel = _worst(
        abs(g - w) / max(abs(w), 1e-30)
        for gs, ws in zip(got["steps"], want["steps"])
        for g, w in zip(gs, ws)
    )
    bf16_loss = runs["fsdp_bf16"]["steps"][0][0]
    bf16_rel = abs(bf16_loss - want["steps"][0][0]) / abs(want["steps"][0][0])
    found = {
        "backend": backend,
        "device": str(device),
        "params": len(want["params"]),
        "dtensors": got["dtensors"],
        "losses": [s[0] for s in got["steps"]],
        "step_rel": step_rel,
        "param_rel": param_rel,
        "bf16_loss_rel": bf16_rel,
    }
    out_json.write_text(json.dumps(found))
    print(json.dumps(found), flush=True)


def float8_save(dump: Path, argv: list[str]) -> None:
    """(k), first process: torchao's float8 weights with the FSDP float8 all-gather on a one-rank
    mesh, saved synchronously through titanlite's CheckpointManager. On CUDA it first trains one
    step (the float8 all-gather runs on NCCL); gloo cannot move float8 tensors, so on CPU the
    optimizer state comes from one AdamW step on unit gradients."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torchdata.stateful_dataloader import StatefulDataLoader

    from parallelisms.float8 import Float8Options
    from parallelisms.fsdp import apply_fsdp
    from titanlite.components.checkpoint.manager import CheckpointManager
    from titanlite.config.schema import Checkpoint
    from titanlite.core import distributed
    from titanlite.trainer.trainer import TrainState

    device = distributed.init(300)
    cuda = device.type == "cuda"
    emulate = not cuda or torch.cuda.get_device_capability(device) < (8, 9)
    opts = Float8Options(fsdp_float8_all_gather=True, emulate=emulate)
    _, _, model = _build(argv, device, float8=opts)
    mesh = init_device_mesh(device.type, (1,), mesh_dim_names=("dp_shard",))
    units = dict(first=[model.tok_embeddings], last=[model.norm, model.output])
    apply_fsdp(
        model, list(model.layers.values()), mesh, param_dtype=torch.float32,
        reduce_dtype=torch.float32, **units,
    )  # fmt: skip
    _materialize(model, device)
    kinds = {n: type(p._local_tensor).__name__ for n, p in model.named_parameters()}
    subclassed = sorted(n for n, kind in kinds.items() if kind != "Tensor")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = None
    if cuda:
        loss, _ = _step(model, optimizer, *_batch(model, device))
    else:
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
    # World size 1: the local tensor (inside torchao's wrapper) is the whole weight.
    values = {
        n: getattr(p._local_tensor, "_tensor", p._local_tensor).detach().cpu().clone()
        for n, p in model.named_parameters()
    }
    torch.save({"subclassed": subclassed, "model": values}, dump / "expected.pt")
    found = {
        "subclassed": len(subclassed),
        "kinds": sorted(set(kinds.values())),
        "tensors": len(values),
        "loss": loss,
    }
    (dump / "saved.json").write_text(json.dumps(found))
    print(json.dumps(found), flush=True)


class _NoTorchao:
    """A meta path finder that makes torchao unimportable, as on a machine without it."""

    def find_spec(self, name, path=None, target=None):
        if name == "torchao" or name.startswith("torchao."):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by gpu_check)")
        return None


def float8_load(dump: Path, argv: list[str]) -> None:
    """(k), second process, torchao unimportable: the checkpoint as full tensors equal to what
    was saved, then a one-step trainer run (TRAIN ARGS, on this device) starting from it."""
    sys.meta_path.insert(0, _NoTorchao())
    import torch

    from titanlite import cli
    from titanlite.components.checkpoint.storage import load_full_state_dict

    expected = torch.load(dump / "expected.pt", weights_only=True)
    path = dump / "checkpoint" / "step-1"
    sd = load_full_state_dict(path)
    plain = all(type(t) is torch.Tensor for t in sd["model"].values())
    diff = max(
        (sd["model"][n].float() - want.float()).abs().max().item()
        for n, want in expected["model"].items()
    )
    resumed = ["--checkpoint.enable_checkpoint", "--checkpoint.initial_load_path", str(path)]
    resumed += ["--training.steps", "1", "--job.dump_folder", str(dump / "resumed")]
    code = cli.main([*argv, *resumed])
    found = {
        "plain_tensors": plain,
        "max_abs_diff": diff,
        "resume_exit": code,
        "torchao_imported": "torchao" in sys.modules,
    }
    (dump / "loaded.json").write_text(json.dumps(found))
    print(json.dumps(found), flush=True)


WORKERS = {"fsdp": fsdp, "float8-save": float8_save, "float8-load": float8_load}

if __name__ == "__main__":
    WORKERS[sys.argv[1]](Path(sys.argv[2]), sys.argv[4:])
