"""The MoE layer (models/moe.py) against Hugging Face's Qwen3 MoE block and against a plain
per-expert loop: same routing, same output, same gradients; the auxiliary loss equals Hugging
Face's for one layer and one sequence; the expert bias steers the choice only and moves towards
balance."""

import pytest
import torch
from transformers import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import (
    Qwen3MoeSparseMoeBlock,
    load_balancing_loss_func,
)

from models.initialization import fill_trunc_normal_
from models.moe import MoE, MoEArgs, finish_step, imbalance, set_aux_loss_weight

DIM, HIDDEN, EXPERTS, TOP_K = 32, 16, 8, 2


def moe(**overrides) -> MoE:
    args = dict(num_experts=EXPERTS, top_k=TOP_K, hidden_dim=HIDDEN, load_balance="none")
    layer = MoE(DIM, MoEArgs(**{**args, **overrides}))
    layer.init_weights("moe", seed=0, out_std=0.05)
    return layer


def hf_block(layer: MoE) -> Qwen3MoeSparseMoeBlock:
    config = Qwen3MoeConfig(
        hidden_size=DIM,
        moe_intermediate_size=HIDDEN,
        num_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        norm_topk_prob=layer.args.norm_topk_prob,
    )
    block = Qwen3MoeSparseMoeBlock(config)
    with torch.no_grad():
        block.gate.weight.copy_(layer.router.gate.weight)
        e = layer.experts
        block.experts.gate_up_proj.copy_(e.w13)
        block.experts.down_proj.copy_(e.w2)
    return block


def hf_routing(block: Qwen3MoeSparseMoeBlock, x: torch.Tensor) -> torch.Tensor:
    return block.gate(x.reshape(-1, DIM))[2]


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_output_and_routing_equal_hugging_face_qwen3_moe(norm_topk_prob):
    layer = moe(norm_topk_prob=norm_topk_prob)
    block = hf_block(layer)
    x = torch.randn(3, 10, DIM)
    got, want = layer(x), block(x)
    chosen = layer.router(x.reshape(-1, DIM))[1]
    assert torch.equal(chosen, hf_routing(block, x))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def loop_reference(layer: MoE, x: torch.Tensor) -> torch.Tensor:
    """Each token through each of its experts one at a time, summed with its weights."""
    flat = x.reshape(-1, DIM)
    weights, chosen, _ = layer.router(flat)
    e = layer.experts
    rows = []
    for t in range(flat.shape[0]):
        out = 0
        for slot in range(TOP_K):
            i = chosen[t, slot]
            w1, w3 = e.w13[i].chunk(2)
            h = torch.nn.functional.silu(flat[t] @ w1.T) * (flat[t] @ w3.T)
            out = out + weights[t, slot] * (h @ e.w2[i].T)
        rows.append(out)
    return torch.stack(rows).view_as(x)


def test_grouped_gemm_equals_a_loop_over_experts_forward_and_backward():
    layer = moe(shared_hidden_dim=24)
    x = torch.randn(2, 12, DIM)
    got = layer(x)
    shared = layer.shared_experts(x)
    want = loop_reference(layer, x) + shared
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    grad = torch.randn_like(got)
    params = [p for p in layer.parameters()]
    got_grads = torch.autograd.grad(got, params, grad)
    want_grads = torch.autograd.grad(want, params, grad)
    for p, g, w in zip(layer.named_parameters(), got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, msg=p[0])


def test_bfloat16_runs_the_grouped_kernel_close_to_float32():
    layer = moe()
    x = torch.randn(2, 16, DIM)
    want = layer(x)
    got = layer.to(torch.bfloat16)(x.bfloat16())
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=5e-2, atol=5e-3)


def test_aux_loss_of_one_sequence_is_hugging_faces_and_reaches_the_router():
    layer = moe(load_balance="aux_loss", aux_loss_coef=0.1)
    x = torch.randn(1, 20, DIM)
    layer(x).sum().backward()
    logits = layer.router.gate(x.reshape(-1, DIM))
    want = load_balancing_loss_func((logits,), EXPERTS, TOP_K)
    torch.testing.assert_close(layer.last_aux_loss, want.detach(), rtol=1e-6, atol=0)
    # Its gradient is coef x d(aux)/d(gate), on top of the output's.
    gate_grad = layer.router.gate.weight.grad.clone()
    plain = moe(load_balance="none")
    plain.load_state_dict(layer.state_dict())
    plain(x).sum().backward()
    aux_grad = torch.autograd.grad(want * 0.1, layer.router.gate.weight)[0]
    torch.testing.assert_close(gate_grad, plain.router.gate.weight.grad + aux_grad)


def test_aux_loss_is_a_mean_over_the_steps_sequences_however_they_are_split():
    """Two forwards of 2 sequences with sequences_per_step 4 give the gradient of one forward
    of all 4: the same objective for micro-batches, pipeline micro-batches and one batch."""
    x = torch.randn(4, 10, DIM)
    whole, split = moe(load_balance="aux_loss"), moe(load_balance="aux_loss")
    for layer in (whole, split):
        set_aux_loss_weight(layer, 4)
    whole(x).sum().backward()
    for part in x.split(2):
        split(part).sum().backward()
    for (name, a), b in zip(whole.named_parameters(), split.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_expert_bias_steers_the_choice_not_the_weights_and_moves_towards_balance():
    layer = moe(load_balance="expert_bias", bias_update_rate=0.01)
    x = torch.randn(4, 16, DIM)
    plain_weights, plain_chosen, _ = layer.router(x.reshape(-1, DIM))
    layer(x)
    load = layer.tokens_per_expert.clone()
    assert load.sum() == 4 * 16 * TOP_K
    finish_step(layer, lambda t: t * 2)  # as if a second rank saw the same tokens
    bias = layer.router.expert_bias
    assert torch.equal(bias, 0.01 * torch.sign(load.float().mean() - load.float()))
    assert layer.tokens_per_expert.sum() == 0 and torch.equal(layer.step_load, 2 * load)
    # A large bias on expert 0 makes every token choose it, with the router's own weight.
    with torch.no_grad():
        bias.zero_()
        bias[0] = 10.0
    weights, chosen, scores = layer.router(x.reshape(-1, DIM))
    assert (chosen == 0).any(-1).all()
    picked = scores.gather(-1, chosen)
    torch.testing.assert_close(weights, picked / picked.sum(-1, keepdim=True))


def test_the_steps_load_is_kept_for_the_metrics_and_imbalance_is_max_over_mean():
    layer = moe()
    layer(torch.randn(2, 8, DIM))
    finish_step(layer, lambda t: t)
    assert layer.step_load.sum() == 2 * 8 * TOP_K and layer.tokens_per_expert.sum() == 0
    assert torch.equal(layer.router.expert_bias, torch.zeros(EXPERTS))  # not an expert_bias layer
    assert imbalance(torch.tensor([2, 2, 2, 2])) == 1
    assert imbalance(torch.tensor([8, 0, 0, 0])) == 4


def test_a_forward_without_autograd_counts_no_tokens():
    """Validation runs the model under no_grad between steps: its tokens must not move the
    next step's expert bias nor count in its load."""
    layer = moe(load_balance="expert_bias")
    with torch.no_grad():
        layer(torch.randn(2, 8, DIM))
    assert layer.tokens_per_expert.sum() == 0
    layer(torch.randn(2, 8, DIM))
    assert layer.tokens_per_expert.sum() == 2 * 8 * TOP_K


def test_initialization_is_a_function_of_the_name_and_seed():
    a, b = moe(), moe()
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name
    w = torch.empty(EXPERTS, HIDDEN, DIM)
    fill_trunc_normal_(w, 0.02, 0, "moe.experts.w1")
    assert torch.equal(w, a.experts.w13[:, :HIDDEN])


def test_a_float32_moe_compiles_whole_and_equals_eager():
    """torch 2.13's compiled _grouped_mm takes bf16 only: float32 goes through titanlite's custom
    ops (models/grouped_mm.py), which the graph keeps whole (fullgraph: no graph break)."""
    torch._dynamo.reset()
    layer = moe(load_balance="aux_loss")
    x = torch.randn(2, 8, DIM)
    want = layer(x)
    want_grads = torch.autograd.grad(want.square().sum(), list(layer.parameters()))
    got = torch.compile(layer, fullgraph=True)(x)
    got_grads = torch.autograd.grad(got.square().sum(), list(layer.parameters()))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for (name, _), g, w in zip(layer.named_parameters(), got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, msg=name)
