"""Activation checkpointing by memory budget (torch.compile's min-cut recomputation), measured on
one process: budgets 0, 0.5 and 1 recompute less and keep more, in that order; they train the
same as no checkpointing; and the activation formula bounds what the blocks keep."""

from typing import cast

import pytest
import torch
from helpers import tiny_llama_args
from torch.utils.flop_counter import FlopCounterMode

from models.llama import Transformer
from parallelisms import Meshes, ParallelDims, ParallelizeOptions
from parallelisms.llama.parallelize import parallelize_llama
from titanlite.components.loss import cross_entropy_sum
from titanlite.planning.activation_memory import estimate_activations

ARGS = tiny_llama_args(attn_mask_type="causal")
BATCH, SEQ, STEPS = 2, 64, 3
BUDGETS = (0.0, 0.5, 1.0)


def _train(budget: float | None) -> dict:
    """STEPS AdamW steps; on the last: the bytes autograd saves in the blocks (each storage once,
    parameters and the RoPE table left out) and the FLOPs backward runs. `None`: no AC, eager."""
    model = Transformer(ARGS)
    if budget is not None:
        opts = ParallelizeOptions(ac_mode="memory_budget", ac_memory_budget=budget, compile=True)
        # One process, no parallelism: parallelize_llama reads no mesh.
        parallelize_llama(model, ParallelDims(1, 1, 1, 1), cast(Meshes, None), opts)
    model.init_weights(seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
    skip.add(model.freqs_cis.untyped_storage().data_ptr())
    saved: dict[int, int] = {}
    in_blocks = [False]
    # Hooks on the eager modules around the blocks (a compiled block's hooks would be traced).
    model.tok_embeddings.register_forward_hook(lambda *_: in_blocks.__setitem__(0, True))
    model.norm.register_forward_pre_hook(lambda *_: in_blocks.__setitem__(0, False))

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if in_blocks[0] and ptr not in skip:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    generator = torch.Generator().manual_seed(1)
    losses, flops = [], FlopCounterMode(display=False)
    for step in range(STEPS):
        tokens = torch.randint(1, ARGS.vocab_size, (BATCH, SEQ + 1), generator=generator)
        saved.clear()  # measured on the last step, once both graphs are compiled
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = cross_entropy_sum(model(tokens[:, :-1]), tokens[:, 1:]) / (BATCH * SEQ)
        if step == STEPS - 1:
            with flops:
                loss.backward()
        else:
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return {
        "losses": losses,
        "saved": sum(saved.values()),
        "backward_flops": flops.get_total_flops(),
    }


@pytest.fixture(scope="module")
def runs() -> dict:
    # Budgets run one after another in this process without a reset: each must get its own
    # graphs (a graph compiled for another budget would keep the same bytes).
    torch._dynamo.reset()
    try:
        return {b: _train(b) for b in (None, *BUDGETS)}
    finally:
        torch._dynamo.reset()


def _formula(budget: float) -> int:
    return estimate_activations(
        ARGS,
        local_batch_size=BATCH,
        seq_len=SEQ,
        tp=1,
        loss_parallel=False,
        ac_mode="memory_budget",
        ac_option="op",
        compute_bytes=4,
        memory_budget=budget,
    ).blocks


@pytest.mark.slow
def test_budgets_trade_recompute_for_memory_and_train_like_no_ac(runs):
    recomputed = {b: runs[b]["backward_flops"] - runs[None]["backward_flops"] for b in BUDGETS}
    saved = {b: runs[b]["saved"] for b in BUDGETS}
    for b in BUDGETS:
        worst = max(abs(g - r) / abs(r) for r, g in zip(runs[None]["losses"], runs[b]["losses"]))
        print(
            f"\nbudget {b}: recomputed {recomputed[b] / 1e6:.1f} MFLOP in backward, blocks keep "
            f"{saved[b] / 2**10:.0f} KiB (formula {_formula(b) / 2**10:.0f} KiB), worst loss "
            f"deviation from no AC {worst:.1e}"
        )
        assert worst <= 1e-4, f"budget {b}: losses {runs[b]['losses']} vs {runs[None]['losses']}"
    print(f"no AC (eager): blocks keep {runs[None]['saved'] / 2**10:.0f} KiB")
    assert recomputed[0.0] > recomputed[0.5] > recomputed[1.0] >= 0
    assert saved[0.0] < saved[0.5] < saved[1.0] < runs[None]["saved"]
    # The partitioner keeps at most `budget` of the way from the inputs (budget 0) to its
    # default choice (budget 1).
    assert saved[0.5] - saved[0.0] <= 0.5 * (saved[1.0] - saved[0.0])
    # Budget 0 keeps exactly the block inputs, as the formula (and full AC) says; above 0 the
    # formula is an upper bound.
    assert saved[0.0] == _formula(0.0)
    assert saved[0.5] <= _formula(0.5) and saved[1.0] <= _formula(1.0)
    assert runs[None]["losses"][-1] < runs[None]["losses"][0]  # it learns, so equality means more
