"""Per-rank activation memory under context parallel, measured: CP 1 / 2 / 4 on one long sequence.

Each CP degree runs in its own gloo process group (one process per cp rank, on CPU); every rank
runs the debug model's forward and backward on its part of the sequence under torch's MemTracker
and reports the peak of activation + temporary memory (parameters, gradients and optimizer state
are counted apart by the tracker and left out). The model is not sharded (no FSDP): only the
activations are compared. Each attention kernel is measured side by side: "auto" (per document
piece, no mask: every preset's default) and "sdpa" (the dense additive mask). The claim checked,
for "auto": each rank's peak is within 1/cp + 15% of the one-process peak.

    python scripts/cp_memory.py                      # the table in docs/parallelism.md
    python scripts/cp_memory.py --seq 8192 --mask block_causal --attn-types auto
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from titanlite.core.arguments import ArgumentParser, int_arg  # noqa: E402

MIB = 2**20


def _measure(
    rank: int, cp: int, port: int, seq: int, batch: int, mask: str, attn: str, out: str
) -> None:
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.device_mesh import init_device_mesh

    from models.llama import FLAVORS, Transformer
    from parallelisms.context_parallel import SequenceShards, apply_cp
    from titanlite.components.loss import local_batch, model_kwargs

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=cp)
    args = FLAVORS["debugmodel"].with_overrides(
        vocab_size=2048, max_seq_len=seq, attn_mask_type=mask, bos_id=1, attn_type=attn
    )
    model = Transformer(args)
    model.init_weights(0)
    shards = None
    if cp > 1:
        shards = SequenceShards(init_device_mesh("cpu", (cp,), mesh_dim_names=("cp",)), "headtail")
        apply_cp(model, list(model.layers.values()), shards)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(2, args.vocab_size, (batch, seq + 1), generator=g)
    tokens[:, :: seq // 8] = 1  # documents of seq / 8 tokens (block_causal only)
    x, window, y = local_batch(shards, tokens[:, :-1], tokens[:, 1:])
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        for step in range(2):  # the second is measured: the first allocates lazily
            logits = model(x, **model_kwargs(window))
            F.cross_entropy(logits.flatten(0, 1).float(), y.flatten()).backward()
            model.zero_grad(set_to_none=True)
            if step == 0:
                tracker.reset_mod_stats()
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    measured = sum(
        v for k, v in peak.items() if str(k).split(".")[-1].lower() in ("act", "activation", "temp")
    )
    everyone: list = [None] * cp
    dist.all_gather_object(everyone, measured)
    if rank == 0:
        Path(out).write_text(json.dumps(everyone))
    dist.destroy_process_group()


def measure(cp: int, seq: int, batch: int, mask: str, attn: str) -> list[int]:
    """Each cp rank's peak activation + temporary bytes."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "peaks.json")
        mp.start_processes(
            _measure,
            args=(cp, port, seq, batch, mask, attn, out),
            nprocs=cp,
            start_method="spawn",
        )
        return json.loads(Path(out).read_text())


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq", type=int_arg(8, 2**24), default=4096)
    parser.add_argument("--batch", type=int_arg(1, 2**20), default=1)
    parser.add_argument("--cps", type=int_arg(1, 2**20), nargs="+", default=[1, 2, 4])
    parser.add_argument("--mask", choices=["causal", "block_causal"], default="causal")
    parser.add_argument(
        "--attn-types", nargs="+", choices=["auto", "sdpa"], default=["auto", "sdpa"]
    )
    a = parser.parse_args(argv)
    print(f"debug model, {a.batch} x {a.seq} tokens, {a.mask} attention, head-tail cut")
    print("peak activation + temporary memory per rank (MiB, max over ranks), / cp 1 of its kernel")
    print("  cp" + "".join(f"   {k:>10} / cp 1" for k in a.attn_types) + "   bound 1/cp + 15%")
    base: dict[str, int] = {}
    ok = True
    for cp in a.cps:
        line = f"  {cp:>2}"
        for attn in a.attn_types:
            peak = max(measure(cp, a.seq, a.batch, a.mask, attn))
            ratio = peak / base.setdefault(attn, peak)
            ok &= attn != "auto" or ratio <= 1 / cp + 0.15
            line += f"   {peak / MIB:>10.1f} {ratio:6.3f}"
        print(f"{line}   {1 / cp + 0.15:.3f}", flush=True)
    print("'auto' within the bound" if ok else "'auto' OVER the bound")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
