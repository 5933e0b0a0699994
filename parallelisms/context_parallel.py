"""Context parallel: each rank of the `cp` mesh dim holds a part of every sequence, and attention
all-gathers the keys and values of the whole sequence over `cp` (TorchTitan's and MaxText's
"allgather" rotation; the backward reduce-scatters their gradients back to the owners).

The parts. With the "headtail" load balancer the sequence is cut into 2·cp chunks and rank i holds
chunks i and 2·cp-1-i: under a causal mask a late chunk attends to many keys and an early one to
few, so pairing them evens the work (and the activation memory) across ranks. "none" gives rank i
the contiguous chunk i.

What the model sees. The trainer passes each rank its part of the token ids as the model input and
the whole window as `tokens=`; a forward pre-hook on the model adds `positions=` (this rank's
query positions, and the key positions in the order the keys arrive from the all-gather: rank 0's
part, then rank 1's, ...). The model then builds, once per forward, the RoPE rows of its queries
and what its attention kernel needs of those queries against all keys, which every block
shares: for "varlen" (what "auto" runs) the pieces to compute — each run of this rank's query
positions inside one document, with the rows of the document's keys up to the run's end — so
no mask exists and only visible keys are computed against, and the head-tail cut evens the
work; for "sdpa" an additive (S/cp) x S mask. Each block's `attention.sdpa` kernel is wrapped
in one that all-gathers k and v (one collective) and hands them, in arrival order, to the
block's own kernel; the keys are never permuted back.

The all-gather is waited on before the block's attention, not overlapped with it: under a causal
mask every rank's tail chunk needs keys from every rank (only rank 0's head chunk needs none from
others), so almost no attention work is rank-local. A ring rotation would overlap one step's
compute with the next step's transfer; it is not built.

So the load balancing and the all-gather live here; the model provides the swappable kernel
and the `tokens=` / `positions=` arguments. FlexAttention is not wired for context parallel.

Knows the model only through its public structure: forward(x, tokens=, positions=) and blocks
with `attention.sdpa`.
"""

from __future__ import annotations

import torch
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from models.moe import MoE
from parallelisms.moe_sequences import complete_sequences_over
from parallelisms.parallel_dims import LayoutError

LOAD_BALANCERS = ("headtail", "none")


def chunks_per_rank(load_balancer: str) -> int:
    return 2 if load_balancer == "headtail" else 1


def rank_positions(seq_len: int, cp: int, rank: int, load_balancer: str) -> torch.Tensor:
    """The window positions cp rank `rank` holds, in the order it holds them."""
    if load_balancer == "none":
        size = seq_len // cp
        return torch.arange(rank * size, (rank + 1) * size)
    size = seq_len // (2 * cp)
    head = torch.arange(rank * size, (rank + 1) * size)
    tail_start = (2 * cp - 1 - rank) * size
    return torch.cat([head, torch.arange(tail_start, tail_start + size)])


class SequenceShards:
    """Cuts batches along the sequence for this cp rank and remembers the positions of the last
    cut, which the model's forward pre-hook passes on (one sequence length at a time)."""

    def __init__(self, mesh: DeviceMesh, load_balancer: str):
        self.mesh, self.load_balancer = mesh, load_balancer
        self.cp, self.rank = mesh.size(), mesh.get_local_rank()
        self.group = mesh.get_group()
        self._cache: dict[tuple[int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}
        self.positions = self.key_positions = torch.empty(0, dtype=torch.long)

    def shard(self, batch: torch.Tensor) -> torch.Tensor:
        """(batch, seq, ...) -> (batch, seq / cp, ...): this rank's positions of each sequence."""
        seq, device = batch.shape[1], batch.device
        key = (seq, device)
        if key not in self._cache:
            per_rank = [rank_positions(seq, self.cp, r, self.load_balancer) for r in range(self.cp)]
            self._cache[key] = (per_rank[self.rank].to(device), torch.cat(per_rank).to(device))
        self.positions, self.key_positions = self._cache[key]
        return batch.index_select(1, self.positions)


class ContextParallelAttention(nn.Module):
    """The block's own attention kernel, run on this rank's queries against the keys and values
    of the whole sequence, all-gathered over cp."""

    def __init__(self, local: nn.Module, group) -> None:
        super().__init__()
        self.local, self.group = local, group

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask) -> torch.Tensor:
        # (batch, heads, seq / cp, head_dim) -> (batch, heads, seq, head_dim), in rank order;
        # autograd reduce-scatters the gradients back to the rank that owns each key. One
        # collective for both: k and v side by side along the last dim (k and v have as many
        # heads, and a value may be narrower than a key: multi-head latent attention).
        width = k.shape[-1]
        kv = funcol.all_gather_single(torch.cat([k, v], dim=-1).contiguous(), 2, self.group)
        return self.local(q, kv[..., :width], kv[..., width:], mask)


def apply_cp(model: nn.Module, blocks: list[nn.Module], shards: SequenceShards) -> None:
    """Pass this rank's positions to every forward of `model`; give each block the all-gathering
    attention kernel."""

    def add_positions(_model: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return args, {**kwargs, "positions": (shards.positions, shards.key_positions)}

    model.register_forward_pre_hook(add_positions, with_kwargs=True)
    for block in blocks:
        attention = block.get_submodule("attention")
        kernel = ContextParallelAttention(attention.get_submodule("sdpa"), shards.group)
        attention.register_module("sdpa", kernel)
        feed_forward = getattr(block, "feed_forward", None)
        if isinstance(feed_forward, MoE):  # its aux loss sees this rank's chunks
            complete_sequences_over(feed_forward, shards.group, grads_summed=False)


def check_context_parallel(
    cp: int,
    tp: int,
    seq_lens: dict[str, int],
    load_balancer: str,
    rotate_method: str,
    attn_type: str,
) -> None:
    """What context parallel needs of the job, before any process group exists."""
    if cp == 1:
        return
    if rotate_method != "allgather":
        raise LayoutError(
            f"parallelism.context_parallel_rotate_method = {rotate_method!r} is not built; "
            "use 'allgather'"
        )
    if attn_type == "flex":
        raise LayoutError(
            "context parallel runs attention per document piece ('varlen') or through masked "
            "SDPA; 'flex' is not wired for it: set model.attn_type = 'auto' (the same masks)"
        )
    parts = cp * chunks_per_rank(load_balancer) * tp
    for name, seq in seq_lens.items():
        if seq % parts:
            how = (
                f"2 x context_parallel_degree ({cp})"
                if load_balancer == "headtail"
                else (f"context_parallel_degree ({cp})")
            )
            raise LayoutError(
                f"{name} = {seq} is not divisible by {how} x tensor_parallel_degree ({tp}) = "
                f"{parts}: the {load_balancer} load balancer cuts each sequence into that many "
                "equal parts; pick a multiple of it"
            )
