"""What expert parallel adds to a rank's memory plan: the all-to-all's buffers, for balanced
routing (in the plan's total) and for the worst routing a step can bring (shown beside it).

Under EP (parallelisms/expert_parallel.py) a rank sends its tokens' k copies (tokens x k rows of
`dim`) and receives the rows its experts were chosen for: tokens x k on average when the
experts are balanced, and at most ep x tokens x min(k, local experts) when every token of the EP
group chose this rank's experts (a token picks k distinct experts, at most min(k, local) of them
here). The received rows are what its grouped GEMMs compute and save for backward (the GEMM
input and the 4 x hidden values models/estimate.py counts per routed row), so an imbalanced
layer also saves more: the worst case counts that too, for one layer (every layer at its worst
at once would need every router to send every token to one rank)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GIB = 1024**3


@dataclass(frozen=True)
class AllToAllPlan:
    ep: int
    efsdp: int  # the experts' FSDP degree
    local_experts: int
    balanced: int  # one layer's send + receive buffers, balanced routing
    worst: int  # the same at the worst routing, plus what that layer's GEMMs save beyond balanced

    def describe(self, total: int, usable: int) -> str:
        worst_total = total - self.balanced + self.worst
        verdict = "FITS" if worst_total <= usable else "DOES NOT FIT"
        return (
            f"expert parallel      EP {self.ep} x efsdp {self.efsdp}: {self.local_experts} experts "
            f"per rank, FSDP-sharded over {self.efsdp}; all-to-all "
            f"buffers {self.balanced / GIB:.2f} GiB balanced (in the total); at the worst routing "
            f"(every token of the EP group to this rank's experts, one layer) {self.worst / GIB:.2f}"
            f" GiB -> total {worst_total / GIB:.2f} GiB, {verdict}"
        )


def all_to_all_plan(
    moe: Any, dim: int, compute_bytes: int, *, tokens: int, ep: int, efsdp: int
) -> AllToAllPlan:
    """`tokens`: the tokens one MoE forward of this rank routes (its micro-batch's, its cp
    chunks and tp piece of them)."""
    local = moe.num_experts // ep
    sent = tokens * moe.top_k
    received_worst = ep * tokens * min(moe.top_k, local)
    row = dim * compute_bytes
    saved_per_row = row + 4 * compute_bytes * moe.hidden_dim
    return AllToAllPlan(
        ep=ep,
        efsdp=efsdp,
        local_experts=local,
        balanced=2 * sent * row,
        worst=(sent + received_worst) * row + (received_worst - sent) * saved_per_row,
    )
