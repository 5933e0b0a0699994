"""Mixture-of-Experts feed-forward, for any family (Qwen3's MoE members today; a DeepSeek-style
family can reuse it): a token-choice top-k router, experts held as 3-D weights and computed with
grouped GEMMs, optional shared experts, and what load balancing needs.

Routing. The router scores every expert (softmax, as Qwen3 and Mixtral; or sigmoid, as
DeepSeek-V3), picks each token's top k, and weighs the chosen experts' outputs by their scores,
renormalized to sum to 1 when `norm_topk_prob` (Qwen3's flag), then multiplied by
`routed_scaling_factor` (DeepSeek-V3's 2.5; 1 elsewhere). Group-limited routing (DeepSeek-V3's
`n_group`, `topk_group`): the experts are `n_group` consecutive groups, a group's score is the
sum of its two best (bias-steered) scores, and each token chooses its k experts among the
experts of its `topk_group` best groups only (so that a token's experts sit on few nodes under
expert parallel). No token is ever dropped: an expert computes every token routed to it.

Compute. The token-expert pairs are sorted by expert (a stable sort, so the order is a function
of the routing alone), each expert's rows are contiguous, and `torch._grouped_mm` runs all
experts' SwiGLU in three calls with the group ends as offsets: no per-expert loop and no host
sync for the split sizes. The outputs go back to their (token, k) slots and are summed over k in
slot order, so the combine is deterministic (no atomics).

Load balancing, chosen by `load_balance`:
- "expert_bias": DeepSeek-V3's auxiliary-loss-free bias. A per-expert bias is added to the
  scores for choosing the experts only (the weights stay the router's); after each step it moves
  by `bias_update_rate` towards balance, from the step's tokens-per-expert counts summed over the
  ranks that saw different tokens (`finish_step`, which the trainer calls before the optimizer
  step with its sum over those ranks). The bias is a persistent buffer: checkpoints
  carry it; a Hugging Face Qwen3 export has no place for it and drops it.
- "aux_loss": the Switch-Transformer load-balancing loss, coefficient `aux_loss_coef` (Qwen3's
  `router_aux_loss_coef`), per MoE layer and per sequence: E * sum_e f_e * P_e with f_e the
  share of the sequence's tokens routed to e (counting every one of the k choices) and P_e the
  mean router probability of e. For one layer and one sequence it is Hugging Face's
  `load_balancing_loss_func`; Hugging Face pools every layer's tokens into one product instead
  of summing per-layer products (docs/moe.md). Per sequence it depends on nothing a data-parallel
  layout changes. It enters the objective through the backward pass (`_AttachAuxLoss`), so
  the model's output and the trainer's loss stay what they are for a dense model; its value is
  kept for the metrics.
- "none".
Besides either, `sequence_aux_coef` > 0 adds DeepSeek-V3's complementary sequence-wise balance
loss (its eq. 17-20): coefficient x sum_e f_e * P_e per sequence, with f_e = E / (k T) x the
tokens of the sequence routed to e and P_e the mean of e's score normalized over the experts
(s / sum_j s_j); it is `sequence_aux_loss` on the normalized scores, divided by k.

Statistics: each MoE layer adds its tokens-per-expert counts into `tokens_per_expert` (a
buffer, never read by the host in the step) in training forwards (with autograd on: not a
validation forward under no_grad); `finish_step` sums them over the data-parallel
ranks into `step_load`, the step's global load, which `imbalance` turns into the max/mean
figure the metrics log.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.grouped_mm import grouped_mm
from models.initialization import fill_trunc_normal_
from models.layers import FeedForward

SCORE_FUNCS = ("softmax", "sigmoid")
LOAD_BALANCE = ("expert_bias", "aux_loss", "none")


@dataclass(frozen=True)
class MoEArgs:
    num_experts: int = 8
    top_k: int = 2
    hidden_dim: int = 64  # each expert's SwiGLU width (Qwen3's moe_intermediate_size)
    shared_hidden_dim: int = 0  # the shared experts' SwiGLU width, 0 = none
    score_func: str = "softmax"
    norm_topk_prob: bool = True
    load_balance: str = "aux_loss"
    aux_loss_coef: float = 1e-3
    bias_update_rate: float = 1e-3
    routed_scaling_factor: float = 1.0
    n_group: int = 1  # expert groups for group-limited routing; 1 = none
    topk_group: int = 1  # the groups each token's experts are chosen from
    sequence_aux_coef: float = 0.0  # DeepSeek-V3's sequence-wise balance loss; 0 = off

    def __post_init__(self) -> None:
        if not 0 < self.top_k <= self.num_experts:
            raise ValueError(f"top_k {self.top_k} must be in 1..num_experts ({self.num_experts})")
        if self.n_group < 1 or self.num_experts % self.n_group:
            raise ValueError(
                f"n_group {self.n_group} must divide the {self.num_experts} experts into equal "
                "groups"
            )
        if not 0 < self.topk_group <= self.n_group:
            raise ValueError(f"topk_group {self.topk_group} must be in 1..n_group ({self.n_group})")
        per_group = self.num_experts // self.n_group
        if self.n_group > 1 and per_group < 2:
            raise ValueError(
                f"n_group {self.n_group} leaves {per_group} expert per group; a group's score "
                "is its two best experts'"
            )
        if self.n_group > 1 and self.top_k > self.topk_group * per_group:
            raise ValueError(
                f"top_k {self.top_k} is more than the {self.topk_group} x {per_group} experts "
                "of the groups a token may use"
            )
        if self.score_func not in SCORE_FUNCS:
            raise ValueError(f"score_func {self.score_func!r}: one of {SCORE_FUNCS}")
        if self.load_balance not in LOAD_BALANCE:
            raise ValueError(f"load_balance {self.load_balance!r}: one of {LOAD_BALANCE}")


class TopKRouter(nn.Module):
    expert_bias: torch.Tensor

    def __init__(self, dim: int, args: MoEArgs):
        super().__init__()
        self.args = args
        self.gate = nn.Linear(dim, args.num_experts, bias=False)
        # Steers the choice only; persistent, so that a resume continues with it.
        self.register_buffer("expert_bias", torch.zeros(args.num_experts), persistent=True)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(tokens, dim) -> the chosen experts' weights (tokens, k) in x's dtype, the chosen
        experts (tokens, k) and every expert's float32 score (tokens, E)."""
        a = self.args
        logits = self.gate(x).float()
        scores = logits.softmax(-1) if a.score_func == "softmax" else logits.sigmoid()
        steered = scores + self.expert_bias if a.load_balance == "expert_bias" else scores
        if a.n_group > 1:
            steered = self._within_best_groups(steered)
        chosen = steered.topk(a.top_k, dim=-1).indices
        weights = scores.gather(-1, chosen)
        if a.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdim=True)
        if a.routed_scaling_factor != 1.0:
            weights = weights * a.routed_scaling_factor
        return weights.to(x.dtype), chosen, scores

    def _within_best_groups(self, steered: torch.Tensor) -> torch.Tensor:
        """The scores with every expert outside the token's topk_group best groups at -inf."""
        a = self.args
        grouped = steered.view(-1, a.n_group, a.num_experts // a.n_group)
        group_scores = grouped.topk(2, dim=-1).values.sum(-1)  # (tokens, n_group)
        best = group_scores.topk(a.topk_group, dim=-1).indices
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
        return grouped.masked_fill(~keep[..., None], float("-inf")).reshape(steered.shape)

    def init_weights(self, key: str, seed: int) -> None:
        fill_trunc_normal_(self.gate.weight, 0.02, seed, f"{key}.gate")
        self.expert_bias.zero_()


class GroupedExperts(nn.Module):
    """E SwiGLU experts as 3-D weights: w13 (E, 2 x hidden, dim), each expert's gate rows then
    its up rows (one grouped GEMM for both, and Hugging Face's `gate_up_proj` layout), and w2
    (E, dim, hidden)."""

    def __init__(self, dim: int, hidden_dim: int, num_experts: int):
        super().__init__()
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * hidden_dim, dim))
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, hidden_dim))

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """x: rows sorted by expert, counts[e] of them for expert e."""
        ends = counts.cumsum(0).to(torch.int32)
        gate, up = grouped_mm(x, self.w13, ends).chunk(2, dim=-1)
        return grouped_mm(F.silu(gate) * up, self.w2, ends)

    def init_weights(self, key: str, seed: int, out_std: float) -> None:
        # As two SwiGLU matrices would be: the gate rows at 0.02, the up rows at out_std.
        hidden = self.w2.shape[-1]
        gate = torch.empty_like(self.w13[:, :hidden])
        up = torch.empty_like(self.w13[:, hidden:])
        fill_trunc_normal_(gate, 0.02, seed, f"{key}.w1")
        fill_trunc_normal_(up, out_std, seed, f"{key}.w3")
        fill_trunc_normal_(self.w2, out_std, seed, f"{key}.w2")
        with torch.no_grad():
            self.w13.copy_(torch.cat([gate, up], dim=1))


class _AttachAuxLoss(torch.autograd.Function):
    """Identity on `out`; its backward also sends `weight` as the gradient of `aux`, which adds
    weight * aux to the objective without the output carrying it."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, aux: torch.Tensor, weight: float) -> torch.Tensor:
        ctx.aux_meta = (aux.shape, aux.dtype, aux.device)
        ctx.weight = weight
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        shape, dtype, device = ctx.aux_meta
        return grad, torch.full(shape, ctx.weight, dtype=dtype, device=device), None


def sequence_aux_loss(
    scores: torch.Tensor,
    chosen: torch.Tensor,
    sequences: int,
    sequence_mean: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """The Switch load-balancing loss of each sequence, averaged over the sequences: scores
    (tokens, E) float32, chosen (tokens, k); the tokens are `sequences` sequences in order, or
    equal pieces of them whose per-sequence means `sequence_mean` completes."""
    num_experts = scores.shape[-1]
    routed = torch.zeros_like(scores).scatter_add_(
        -1, chosen, torch.ones_like(scores[:, :1]).expand_as(chosen)
    )
    share = routed.view(sequences, -1, num_experts).mean(1)  # routed to e per token, k in all
    probability = scores.view(sequences, -1, num_experts).mean(1)
    if sequence_mean is not None:
        share, probability = sequence_mean(torch.cat([share, probability], -1)).chunk(2, -1)
    return num_experts * (share * probability).sum(-1).mean()


class MoE(nn.Module):
    tokens_per_expert: torch.Tensor
    step_load: torch.Tensor

    def __init__(self, dim: int, args: MoEArgs):
        super().__init__()
        self.args = args
        self.router = TopKRouter(dim, args)
        self.experts = GroupedExperts(dim, args.hidden_dim, args.num_experts)
        self.shared_experts = (
            FeedForward(dim, args.shared_hidden_dim) if args.shared_hidden_dim else None
        )
        for name in ("tokens_per_expert", "step_load"):  # this step's so far; the last step's
            counts = torch.zeros(args.num_experts, dtype=torch.int64)
            self.register_buffer(name, counts, persistent=False)
        # Set by the trainer (set_aux_loss_weight): the objective is a mean over its step's
        # sequences, this forward holding x.shape[0] of them.
        self.sequences_per_step = 1
        # Set by a layout that gives this layer only a piece of each sequence (tensor parallel):
        # completes a per-sequence mean over the other pieces, for the auxiliary loss.
        self.sequence_mean: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.last_aux_loss: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch_shape, dim = x.shape, x.shape[-1]
        flat = x.reshape(-1, dim)
        weights, chosen, scores = self.router(flat)
        k, num_experts = chosen.shape[-1], self.args.num_experts
        slots = chosen.flatten()
        counts = torch.zeros(num_experts, dtype=torch.int64, device=x.device)
        counts.scatter_add_(0, slots, torch.ones_like(slots))
        if torch.is_grad_enabled():  # training; not validation's forwards, whose tokens would
            with torch.no_grad():  # move the next step's expert bias
                self.tokens_per_expert += counts
        order = slots.argsort(stable=True)
        routed = self.experts(flat[order // k], counts) * weights.flatten()[order, None]
        by_slot = torch.empty_like(routed).index_copy(0, order, routed)
        out = by_slot.view(-1, k, dim).sum(1)
        if torch.is_grad_enabled():
            out = self._attach_balance_losses(
                out, scores, chosen, batch_shape[0] if x.dim() == 3 else 1
            )
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)
        return out.view(batch_shape)

    def _attach_balance_losses(
        self, out: torch.Tensor, scores: torch.Tensor, chosen: torch.Tensor, sequences: int
    ) -> torch.Tensor:
        """`out`, carrying in its backward the auxiliary losses the args ask for; their sum,
        before the coefficients, is kept (`last_aux_loss`) for the metrics."""
        a, share = self.args, sequences / self.sequences_per_step
        losses = []
        if a.load_balance == "aux_loss":
            aux = sequence_aux_loss(scores, chosen, sequences, self.sequence_mean)
            losses.append((aux, a.aux_loss_coef))
        if a.sequence_aux_coef:
            normalized = scores / scores.sum(-1, keepdim=True)
            aux = sequence_aux_loss(normalized, chosen, sequences, self.sequence_mean) / a.top_k
            losses.append((aux, a.sequence_aux_coef))
        for aux, coef in losses:
            out = _AttachAuxLoss.apply(out, aux, coef * share)
        if losses:
            self.last_aux_loss = torch.stack([aux.detach() for aux, _ in losses]).sum()
        return out

    def init_weights(self, key: str, seed: int, out_std: float) -> None:
        self.router.init_weights(f"{key}.router", seed)
        self.tokens_per_expert.zero_()
        self.step_load.zero_()
        self.experts.init_weights(f"{key}.experts", seed, out_std)
        if self.shared_experts is not None:
            self.shared_experts.init_weights(f"{key}.shared_experts", seed, out_std)


def moe_layers(model: nn.Module) -> Iterator[tuple[str, MoE]]:
    for name, module in model.named_modules():
        if isinstance(module, MoE):
            yield name, module


def set_aux_loss_weight(model: nn.Module, sequences_per_step: int) -> None:
    """The sequences one rank trains per optimizer step (micro-batch x accumulation steps):
    each forward's auxiliary loss weighs its share of them."""
    for _, layer in moe_layers(model):
        layer.sequences_per_step = sequences_per_step


@torch.no_grad()
def finish_step(model: nn.Module, global_sum: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """After a step's backward, before its optimizer step: the step's tokens-per-expert counts,
    summed by `global_sum` over the ranks that saw different tokens (one collective for all
    layers, on the device), become each layer's `step_load`; each expert_bias layer moves its
    bias by bias_update_rate towards balance (up for the under-loaded experts, down for the
    over-loaded); the counts restart."""
    layers = [layer for _, layer in moe_layers(model)]
    if not layers:
        return
    loads = global_sum(torch.stack([layer.tokens_per_expert for layer in layers]))
    for layer, load in zip(layers, loads):
        layer.step_load.copy_(load)
        layer.tokens_per_expert.zero_()
        if layer.args.load_balance == "expert_bias":
            load = load.float()
            layer.router.expert_bias += layer.args.bias_update_rate * torch.sign(load.mean() - load)


def imbalance(counts: torch.Tensor) -> torch.Tensor:
    """max/mean tokens per expert: 1 when balanced, E when every token chose one expert."""
    counts = counts.float()
    return counts.max() / counts.mean().clamp_min(1e-9)
