"""Per-rank parameter, gradient and optimizer-state bytes of the ~100M model under FSDP and TP.

Why: the point of FSDP is that each of N ranks holds about 1/N of the training state
(parameters, gradients, Adam's two moments). That is a property of the real code path, not of
arithmetic, so this script measures it on real gloo process groups: the model is built as the
trainer builds it (meta device -> parallelize_llama -> to_empty -> init_weights), the optimizer
comes from titanlite.components.optim.build_optimizer, and one real forward/backward/clip/optimizer step
on a tiny batch makes the gradients and Adam states exist. Then each rank counts the bytes of
the LOCAL shards it holds (DTensor.to_local()), and the worst rank is reported against the
1-process figure and the bound 1/N + 5%.

Activations and allocator caches are deliberately not counted: they depend on batch shape and
allocator policy, while the bytes counted here are what sharding promises to divide.

    python scripts/memory_benchmark.py                 # 1, 2, 4 FSDP ranks and TP 2
    python scripts/memory_benchmark.py --json mem.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark import DEBUG_TOML, MODEL_100M  # noqa: E402  (the same ~100M model as there)

from titanlite.core.arguments import ArgumentParser, int_arg  # noqa: E402

# layout name -> (world size, tensor-parallel degree); data_parallel_shard_degree is what is left.
LAYOUTS: dict[str, tuple[int, int]] = {
    "fsdp1": (1, 1),
    "fsdp2": (2, 1),
    "fsdp4": (4, 1),
    "tp2": (2, 2),
}
MIB = 2**20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_bytes(t: Any) -> int:
    """Bytes of the part of t this rank actually holds."""
    import torch
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.to_local()
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def measure(world: int, tp: int, seq_len: int) -> dict[str, int]:
    """On this rank: build, take one step, count local bytes (process group already up)."""
    import torch

    from parallelisms import ParallelDims, ParallelizeOptions
    from parallelisms.llama import parallelize_llama
    from parallelisms.tensor_parallel import loss_context
    from titanlite.components.loss import cross_entropy_loss
    from titanlite.components.optim import build_optimizer, clip_grad_norm_
    from titanlite.families import get_family
    from titanlite.preflight import checks as preflight

    with tempfile.TemporaryDirectory(prefix="titanlite-mem-") as dump:
        # preflight resolves the model args (vocab from the bundled tokenizer) exactly as the
        # trainer would for this layout, and rejects a layout the trainer would reject.
        job, pre = preflight.run(
            [
                "--config",
                str(DEBUG_TOML),
                "--job.dump_folder",
                dump,
                *MODEL_100M,
                "--training.seq_len",
                str(seq_len),
                "--training.local_batch_size",
                "1",
                "--parallelism.tensor_parallel_degree",
                str(tp),
            ],
            world,
        )
    dims = ParallelDims.resolve(1, -1, tp, world)
    meshes = dims.build_meshes("cpu")
    with torch.device("meta"):
        model = get_family(job.model.name).model.model_cls(pre.model_args)
    parallelize_llama(model, dims, meshes, ParallelizeOptions())
    model.to_empty(device=torch.device("cpu"))
    model.init_weights(0, buffer_device=torch.device("cpu"))
    model.train()
    optimizer = build_optimizer(model, job.optimizer)
    params = [p for p in model.parameters() if p.requires_grad]

    # Same tokens on every rank: TP ranks must agree on their input; FSDP ranks need not, but
    # identical data keeps the run reproducible.
    gen = torch.Generator().manual_seed(0)
    window = torch.randint(pre.model_args.vocab_size, (1, seq_len + 1), generator=gen)
    # ParallelizeOptions() keeps loss parallel on, so under TP the loss runs on vocab shards.
    with loss_context(dims.tp_enabled):
        loss = cross_entropy_loss(model(window[:, :-1]), window[:, 1:])
        loss.backward()
    clip_grad_norm_(params, job.training.max_norm)
    optimizer.step()

    grads = [p.grad for p in params]
    assert all(g is not None for g in grads), "a parameter got no gradient"
    return {
        "params": sum(local_bytes(p) for p in params),
        "grads": sum(local_bytes(g) for g in grads),
        # exp_avg, exp_avg_sq and step, whatever the optimizer keeps per parameter.
        "optimizer": sum(
            local_bytes(v) for state in optimizer.state.values() for v in state.values()
        ),
        "n_params": get_family(job.model.name).model.num_params(pre.model_args),
    }


def worker(rank: int, world: int, tp: int, port: int, seq_len: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    # Up to 4 ranks share the cores: one thread each avoids oversubscription.
    torch.set_num_threads(1)
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mine = measure(world, tp, seq_len)
        everyone: list[dict[str, int]] = [{}] * world
        dist.all_gather_object(everyone, mine)
        if rank == 0:
            Path(out).write_text(json.dumps(everyone))
    finally:
        dist.destroy_process_group()


def run_layout(name: str, seq_len: int) -> list[dict[str, int]]:
    import torch.multiprocessing as mp

    world, tp = LAYOUTS[name]
    with tempfile.TemporaryDirectory(prefix="titanlite-mem-") as tmp:
        out = str(Path(tmp) / "ranks.json")
        # Fresh processes per layout: a process group can be made once per process.
        mp.start_processes(
            worker, args=(world, tp, free_port(), seq_len, out), nprocs=world, start_method="spawn"
        )
        return json.loads(Path(out).read_text())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--layouts",
        default=",".join(LAYOUTS),
        help=f"comma-separated, from {', '.join(LAYOUTS)} (default: all; fsdp1 is "
        "always run, as the reference)",
    )
    ap.add_argument(
        "--seq-len",
        type=int_arg(1, 2**24),
        default=16,
        help="tokens in the one tiny batch (default 16; must divide by the TP degree)",
    )
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args(argv)
    unknown = [x for x in args.layouts.split(",") if x not in LAYOUTS]
    if unknown:
        ap.error(f"unknown layout(s) {', '.join(unknown)}; choose from {', '.join(LAYOUTS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # A leftover torchrun environment would point the workers at the wrong rendezvous.
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(var, None)
    names = ["fsdp1"] + [x for x in args.layouts.split(",") if x != "fsdp1"]
    rows = []
    for name in names:
        per_rank = run_layout(name, args.seq_len)
        world, tp = LAYOUTS[name]
        # The worst rank is what has to fit; uneven shards make ranks differ slightly.
        worst = max(per_rank, key=lambda r: r["params"] + r["grads"] + r["optimizer"])
        total = worst["params"] + worst["grads"] + worst["optimizer"]
        rows.append(
            {
                "layout": name,
                "ranks": world,
                "tp": tp,
                "n_params": worst["n_params"],
                "params_bytes": worst["params"],
                "grads_bytes": worst["grads"],
                "optimizer_bytes": worst["optimizer"],
                "total_bytes": total,
                "per_rank_total_bytes": [
                    r["params"] + r["grads"] + r["optimizer"] for r in per_rank
                ],
            }
        )
        print(f"{name}: {world} rank(s), worst rank {total / MIB:.1f} MiB", flush=True)
    base = rows[0]["total_bytes"]
    print(f"\nmodel: {rows[0]['n_params']:,} parameters (fp32, AdamW fused)\n")
    print(
        "| layout | ranks | params MiB | grads MiB | optimizer MiB | total MiB/rank | "
        "fraction of 1-process | bound (1/N + 5%) | OK? |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        r["fraction"] = r["total_bytes"] / base
        r["bound"] = 1 / r["ranks"] + 0.05
        r["ok"] = r["fraction"] <= r["bound"]
        label = f"TP {r['tp']}" if r["tp"] > 1 else f"FSDP {r['ranks']}"
        print(
            f"| {label} | {r['ranks']} | {r['params_bytes'] / MIB:.1f} | "
            f"{r['grads_bytes'] / MIB:.1f} | {r['optimizer_bytes'] / MIB:.1f} | "
            f"{r['total_bytes'] / MIB:.1f} | {r['fraction']:.4f} | "
            f"{r['bound']:.2f} | {'yes' if r['ok'] else 'NO'} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
