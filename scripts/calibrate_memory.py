"""Calibrate the dry run's activation-memory formula against a real training step on CPU.

For each (model, activation checkpointing) case, one process runs real training steps under
torch's MemTracker and reports the peak of activation + temporary memory, next to what
titanlite.planning.activation_memory predicts for the same shapes.

    python scripts/calibrate_memory.py               # the table in docs/dry_run.md
    python scripts/calibrate_memory.py --cases debug:none
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed._tools.mem_tracker import MemTracker

from models.llama import FLAVORS, Transformer, num_params
from parallelisms.activation_checkpoint import apply_ac
from titanlite.core.arguments import ArgumentParser
from titanlite.planning.activation_memory import estimate_activations

MODELS = {
    "debug": dict(flavor="debugmodel", overrides={}, batch=8, seq=256),
    "100m": dict(
        flavor="debugmodel", overrides=dict(dim=768, n_layers=12, n_heads=12), batch=4, seq=512
    ),
}
MIB = 2**20


def measure(model_name: str, ac: str) -> tuple[int, float, float]:
    spec = MODELS[model_name]
    args = FLAVORS[spec["flavor"]].with_overrides(
        vocab_size=512, max_seq_len=spec["seq"], **spec["overrides"]
    )
    model = Transformer(args)
    model.init_weights(0)
    mode, option = (ac.split("_") + ["1"])[:2] if ac != "none" else ("none", "1")
    for name, block in apply_ac(dict(model.layers.items()), mode, option).items():
        model.layers.register_module(name, block)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    tokens = torch.randint(0, 512, (spec["batch"], spec["seq"]))
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    with tracker:
        for step in range(2):  # the second step is measured: optimizer state exists
            loss = F.cross_entropy(model(tokens).flatten(0, 1).float(), tokens.flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if step == 0:
                tracker.reset_mod_stats()
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    measured = sum(
        v for k, v in peak.items() if str(k).split(".")[-1].lower() in ("act", "activation", "temp")
    )
    est = estimate_activations(
        args,
        local_batch_size=spec["batch"],
        seq_len=spec["seq"],
        tp=1,
        loss_parallel=False,
        ac_mode=mode,
        ac_option=option,
        compute_bytes=4,
    )
    return num_params(args), measured / MIB, est.total / MIB


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cases",
        default="debug:none,debug:full,debug:selective_op,debug:selective_2,"
        "100m:none,100m:full,100m:selective_op",
    )
    cases = [c.split(":") for c in parser.parse_args().cases.split(",")]
    print("| model | params | AC | measured peak (MiB) | predicted (MiB) | predicted / measured |")
    print("|---|---|---|---|---|---|")
    for model_name, ac in cases:
        n, measured, predicted = measure(model_name, ac)
        print(
            f"| {model_name} | {n / 1e6:.1f}M | {ac} | {measured:.1f} | {predicted:.1f} | "
            f"{predicted / measured:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
