"""What the loss region of a training step holds, in bytes per token x vocabulary entry: the
trainer's own step (TrainStep.forward_backward) on a one-block Llama in bf16 autocast, under
torch's MemTracker, at two vocabulary sizes and two token counts. The difference of differences
keeps only the terms that grow with tokens x vocabulary (the logits, the float32 loss and their
gradients), not the output head's weights or its bf16 copy (vocabulary only) nor the block's
activations (tokens only). The dry run plans the same region with the family's formula
(`outside` and `loss_backward`): the two must agree.

    python scripts/loss_memory.py                 # Llama 3's vocabulary, bf16
    python scripts/loss_memory.py --dtype float32
"""

from __future__ import annotations

import contextlib

import torch
from torch.distributed._tools.mem_tracker import MemTracker

from models.llama import FLAVORS, Transformer
from models.llama.estimate import activations
from titanlite.components.loss import cross_entropy_sum
from titanlite.components.nonfinite import NonFiniteGuard
from titanlite.core.arguments import ArgumentParser
from titanlite.trainer.train_step import TrainStep

VOCABS = (64_128, 128_256)  # Llama 3's, and half of it
TOKENS = (64, 128)  # one sequence of each length


def measure(vocab: int, tokens: int, dtype: torch.dtype) -> int:
    """Peak bytes of activations and temporaries in one forward/backward of the trainer's step."""
    args = FLAVORS["debugmodel"].with_overrides(
        vocab_size=vocab, dim=64, n_layers=1, n_heads=4, n_kv_heads=2, max_seq_len=tokens
    )
    model = Transformer(args)
    model.init_weights(0)
    amp = torch.autocast("cpu", dtype=dtype) if dtype != torch.float32 else contextlib.nullcontext()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    step = TrainStep(
        model,
        optimizer,
        torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
        cross_entropy_sum,
        step=lambda: 1,
        device=torch.device("cpu"),
        amp=amp,
        loss_parallel=False,
        sequence_shards=None,
        loss_ranks=1,
        global_sum=lambda t: t,
        max_norm=1.0,
        nonfinite=NonFiniteGuard(0),
    )
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (1, tokens), generator=g)
    y = torch.randint(0, vocab, (1, tokens), generator=g)
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    with tracker:
        step.forward_backward((x, None, y), scale=1.0 / tokens, last=True)
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    return sum(v for k, v in peak.items() if str(k).split(".")[-1].lower() in ("act", "temp"))


def planned(vocab: int, tokens: int, dtype: torch.dtype) -> float:
    """The family's formula for what lies after the last block: the saved part (`outside`) and
    the backward's transient (`loss_backward`)."""
    args = FLAVORS["debugmodel"].with_overrides(vocab_size=vocab, dim=64, n_layers=1)
    terms = activations(
        args,
        local_batch_size=1,
        seq_len=tokens,
        tp=1,
        cp=1,
        loss_parallel=False,
        compute_bytes=dtype.itemsize,
        device_type="cpu",
    )
    return terms.outside + terms.loss_backward


def per_token_and_vocab(value, vocabs=VOCABS, tokens=TOKENS) -> float:
    """The tokens x vocabulary coefficient of value(vocab, tokens), by differences."""
    (v1, v2), (t1, t2) = vocabs, tokens
    both = value(v2, t2) - value(v1, t2) - value(v2, t1) + value(v1, t1)
    return both / ((v2 - v1) * (t2 - t1))


def loss_region(dtype: torch.dtype, vocabs=VOCABS, tokens=TOKENS, show=False) -> tuple:
    """(measured, planned) bytes per token x vocabulary entry."""
    peaks = {(v, t): measure(v, t, dtype) for v in vocabs for t in tokens}
    if show:
        for (v, t), p in peaks.items():
            print(
                f"vocab {v:>7,}  tokens {t:>4}  peak activations + temporaries {p / 2**20:.1f} MiB"
            )
    measured = per_token_and_vocab(lambda v, t: peaks[v, t], vocabs, tokens)
    planned_ = per_token_and_vocab(lambda v, t: planned(v, t, dtype), vocabs, tokens)
    return measured, planned_


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    dtype = getattr(torch, parser.parse_args(argv).dtype)
    measured, formula = loss_region(dtype, show=True)
    print(
        f"loss region ({dtype}): measured {measured:.2f} bytes per token x vocab, "
        f"planned {formula:.2f} ({formula / measured:.2f} x)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
