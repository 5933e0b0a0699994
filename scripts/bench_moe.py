"""Tokens/s of an MoE model's training step with the experts as grouped GEMMs (titanlite's
`models.moe.GroupedExperts`) against a loop over the experts, side by side in one process:
rounds alternate between the two so that a busy machine slows both alike.

    python scripts/bench_moe.py                      # Qwen3 debugmodel_moe, fp32, CPU
    python scripts/bench_moe.py --batch 8 --seq 256 --rounds 5 --steps 3

The loop is what an MoE without grouped GEMMs runs: the rows of each expert taken by the split
sizes (read on the host, one sync per layer) and one pair of matmuls per expert. Both compute
the same function (the script checks the losses agree before timing).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from models.moe import GroupedExperts  # noqa: E402
from models.qwen3 import FLAVORS, Qwen3  # noqa: E402
from titanlite.core.arguments import ArgumentParser, int_arg  # noqa: E402

GROUPED = GroupedExperts.forward


def looped(self: GroupedExperts, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    outs = []
    for e, rows in enumerate(x.split(counts.tolist())):
        gate, up = (rows @ self.w13[e].T).chunk(2, dim=-1)
        outs.append((F.silu(gate) * up) @ self.w2[e].T)
    return torch.cat(outs)


def step(model: Qwen3, tokens: torch.Tensor) -> float:
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
    loss.backward()
    model.zero_grad(set_to_none=True)
    return loss.item()


def timed(model: Qwen3, tokens: torch.Tensor, steps: int) -> float:
    """Tokens per second over `steps` forward+backward steps."""
    start = time.perf_counter()
    for _ in range(steps):
        step(model, tokens)
    return steps * tokens[:, :-1].numel() / (time.perf_counter() - start)


def main() -> None:
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--flavor", default="debugmodel_moe")
    p.add_argument("--batch", type=int_arg(1, 2**20), default=8)
    p.add_argument("--seq", type=int_arg(1, 2**24), default=256)
    p.add_argument("--vocab", type=int_arg(1, 2**31 - 1), default=2048)
    p.add_argument("--rounds", type=int_arg(1, 10**9), default=5)
    p.add_argument("--steps", type=int_arg(1, 10**9), default=3, help="steps per round and variant")
    p.add_argument(
        "--threads", type=int_arg(0, 2**16), default=0, help="torch threads (0 = torch's choice)"
    )
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    args = dataclasses.replace(FLAVORS[a.flavor], vocab_size=a.vocab, max_seq_len=a.seq)
    model = Qwen3(args)
    model.init_weights(seed=0)
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=torch.manual_seed(0))
    variants = {"grouped GEMM": GROUPED, "loop over experts": looped}
    losses = {}
    for name, forward in variants.items():
        GroupedExperts.forward = forward  # type: ignore[method-assign]
        losses[name] = step(model, tokens)  # also the warm-up
    print(f"losses agree: {losses}")
    assert abs(losses["grouped GEMM"] - losses["loop over experts"]) < 1e-4, losses
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(a.rounds):
        for name, forward in variants.items():
            GroupedExperts.forward = forward  # type: ignore[method-assign]
            rates[name].append(timed(model, tokens, a.steps))
        print(f"round {r + 1}: " + ", ".join(f"{n} {v[-1]:,.0f} tok/s" for n, v in rates.items()))
    GroupedExperts.forward = GROUPED  # type: ignore[method-assign]
    median = {name: sorted(v)[len(v) // 2] for name, v in rates.items()}
    ratio = median["grouped GEMM"] / median["loop over experts"]
    print(
        f"{a.flavor}, {a.batch} x {a.seq} tokens, fp32, {torch.get_num_threads()} threads: "
        f"grouped GEMM {median['grouped GEMM']:,.0f} tok/s, loop {median['loop over experts']:,.0f}"
        f" tok/s (median of {a.rounds}); grouped / loop = {ratio:.2f}"
    )


if __name__ == "__main__":
    main()
