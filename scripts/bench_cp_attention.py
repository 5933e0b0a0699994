"""Per-rank attention time under context parallel: the per-document pieces ("auto") against the
dense additive mask ("sdpa"), side by side in one process.

Each cp rank's attention (forward + backward of its queries against the gathered keys, as a
block runs it after the all-gather) is timed in this process, rank after rank, so the figures
are the kernels' own cost with no collective. Grouped-query heads (8 query, 2 key/value heads of
64), float32 on CPU, one sequence of `--seq` tokens, head-tail cut; "causal" is one document per
window, "block_causal" documents of 1,900-3,300 tokens (the bundled corpus's lengths) at random
starts. Variants alternate per rank and repeat; each figure is the median of `--repeats`.

    python scripts/bench_cp_attention.py                  # the table in docs/performance.md
    python scripts/bench_cp_attention.py --seq 4096 --repeats 3 --cps 2
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from models.attention import attend, document_pieces  # noqa: E402
from models.llama import FLAVORS, Transformer  # noqa: E402
from parallelisms.context_parallel import rank_positions  # noqa: E402
from titanlite.core.arguments import ArgumentParser, int_arg  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 8, 2, 64


def window(seq: int, mask: str, generator: torch.Generator) -> torch.Tensor:
    tokens = torch.randint(2, 1000, (1, seq), generator=generator)
    if mask == "block_causal":
        start = 0
        while start < seq:
            tokens[0, start] = 1
            start += int(torch.randint(1900, 3301, (), generator=generator))
    return tokens


def rank_seconds(model, tokens, qkv, cp: int, rank: int, repeats: int) -> float:
    keys = torch.cat([rank_positions(tokens.shape[1], cp, r, "headtail") for r in range(cp)])
    mine = rank_positions(tokens.shape[1], cp, rank, "headtail")
    mask = model.attention_mask(tokens, (mine, keys))
    q, k, v = qkv
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = attend(q[:, :, mine], k[:, :, keys], v[:, :, keys], mask)
        out.sum().backward()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def pairs(tokens: torch.Tensor, cp: int, rank: int) -> int:
    """Query-key pairs the mask allows for this rank: what the pieces compute."""
    keys = torch.cat([rank_positions(tokens.shape[1], cp, r, "headtail") for r in range(cp)])
    mine = rank_positions(tokens.shape[1], cp, rank, "headtail")
    d = document_pieces(tokens, 1, mine, keys)
    q, k = torch.diff(d.cu_seqlens_q).long(), torch.diff(d.cu_seqlens_k).long()
    return int((k * q - q * (q - 1) // 2).sum())


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq", type=int_arg(1, 2**24), default=8192)
    parser.add_argument("--cps", type=int_arg(1, 2**20), nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int_arg(1, 10**9), default=5)
    parser.add_argument("--threads", type=int_arg(1, 2**16), default=1)
    a = parser.parse_args(argv)
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    shapes = [(1, HEADS, a.seq, HEAD_DIM), (1, KV_HEADS, a.seq, HEAD_DIM)]
    qkv = [torch.randn(shapes[min(i, 1)], generator=g).requires_grad_() for i in range(3)]
    print(
        f"per-rank attention forward + backward (ms, median of {a.repeats}), seq {a.seq}, "
        f"{HEADS}/{KV_HEADS} heads of {HEAD_DIM}, float32, {a.threads} thread(s), head-tail cut"
    )
    print(
        "| mask | cp | rank | pieces ('auto') | masked 'sdpa' | sdpa / pieces | pairs / S²/(2cp) |"
    )
    print("|---|---|---|---|---|---|---|")
    for mask in ("causal", "block_causal"):
        tokens = window(a.seq, mask, g)
        models = {}
        for kind in ("auto", "sdpa"):  # only their attention_mask is used: no weights needed
            args = FLAVORS["debugmodel"].with_overrides(
                vocab_size=2048, max_seq_len=a.seq, attn_mask_type=mask, attn_type=kind, bos_id=1
            )
            with torch.device("meta"):
                models[kind] = Transformer(args)
        for cp in a.cps:
            for rank in range(cp):
                ms = {
                    kind: 1e3 * rank_seconds(m, tokens, qkv, cp, rank, a.repeats)
                    for kind, m in models.items()
                }
                share = pairs(tokens, cp, rank) / (a.seq**2 / (2 * cp))
                print(
                    f"| {mask} | {cp} | {rank} | {ms['auto']:.0f} | {ms['sdpa']:.0f} | "
                    f"{ms['sdpa'] / ms['auto']:.2f} | {share:.3f} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
