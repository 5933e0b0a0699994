"""Qwen3's Mixture-of-Experts members: parameter counts equal Hugging Face's Qwen3MoeForCausalLM
(total, and the active ones FLOPs are counted on), and the debug MoE model's logits equal
transformers' with the same weights (fp32, <= 1e-5), the chosen experts included."""

import dataclasses

import pytest
import torch

from models.moe import MoE
from models.qwen3 import FLAVORS, HF, Qwen3, num_params, training_flops_per_token

transformers = pytest.importorskip("transformers")

VOCAB, SEQ = 512, 48
# The published configs (Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B config.json).
PUBLISHED = {
    "30B-A3B": dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                    num_attention_heads=32, num_hidden_layers=48),
    "235B-A22B": dict(hidden_size=4096, intermediate_size=12288, moe_intermediate_size=1536,
                      num_attention_heads=64, num_hidden_layers=94),
}  # fmt: skip


def hf_config(args, **shape) -> "transformers.Qwen3MoeConfig":
    return transformers.Qwen3MoeConfig(
        vocab_size=args.vocab_size,
        hidden_size=args.dim,
        intermediate_size=args.ffn_hidden_dim,
        moe_intermediate_size=args.moe_hidden_dim,
        num_hidden_layers=args.n_layers,
        num_attention_heads=args.n_heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        num_experts=args.moe_experts,
        num_experts_per_tok=args.moe_top_k,
        norm_topk_prob=args.moe_norm_topk_prob,
        rms_norm_eps=args.norm_eps,
        rope_theta=args.rope_theta,
        max_position_embeddings=args.max_seq_len,
        tie_word_embeddings=False,
        **shape,
    )


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_parameter_counts_equal_the_published_models(name):
    args = dataclasses.replace(FLAVORS[name], vocab_size=151_936)
    cfg = hf_config(args)
    assert (cfg.num_key_value_heads, cfg.num_experts, cfg.num_experts_per_tok) == (4, 128, 8)
    for key, value in PUBLISHED[name].items():
        assert getattr(cfg, key) == value, key
    with torch.device("meta"):
        model = transformers.Qwen3MoeForCausalLM(cfg)
    assert num_params(args) == sum(p.numel() for p in model.parameters())
    # Active: router, 8 of 128 experts, attention, norms, embedding and head (the names' "A3B"
    # and "A22B").
    active = num_params(args, active_only=True)
    expert = 3 * args.dim * args.moe_hidden_dim
    assert num_params(args) - active == args.n_layers * 120 * expert
    assert round(active / 1e9, 2) == {"30B-A3B": 3.35, "235B-A22B": 22.19}[name]
    matmuls = num_params(args, include_embedding=False, active_only=True)
    attention = 12 * args.n_layers * args.n_heads * args.head_dim * 4096
    assert training_flops_per_token(args, 4096) == 6 * matmuls + attention


def _titanlite_state(hf_sd: dict, args) -> dict:
    """HF's fused expert tensors are titanlite's w13 (gate rows, then up rows) and w2."""
    moe_names = {
        "feed_forward.router.gate.weight": "mlp.gate.weight",
        "feed_forward.experts.w13": "mlp.experts.gate_up_proj",
        "feed_forward.experts.w2": "mlp.experts.down_proj",
    }
    out = {}
    for key in HF.state_dict_shapes(dataclasses.replace(args, moe_experts=0)):
        if ".feed_forward." not in key:
            out[key] = HF.from_hf_tensor(key, hf_sd[HF.to_hf_name(key)], args)
    for i in range(args.n_layers):
        for ours, theirs in moe_names.items():
            out[f"layers.{i}.{ours}"] = hf_sd[f"model.layers.{i}.{theirs}"]
        out[f"layers.{i}.feed_forward.router.expert_bias"] = torch.zeros(args.moe_experts)
    return out


def test_debug_moe_logits_and_routing_equal_hugging_face():
    args = dataclasses.replace(FLAVORS["debugmodel_moe"], vocab_size=VOCAB, max_seq_len=SEQ)
    cfg = hf_config(args)
    cfg.initializer_range = 0.05
    torch.manual_seed(0)
    hf_model = transformers.Qwen3MoeForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in hf_model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    model = Qwen3(args)
    model.load_state_dict(_titanlite_state(hf_model.state_dict(), args))
    tokens = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(0))
    chosen: dict[str, list] = {"ours": [], "hf": []}
    hooks = [
        m.router.register_forward_hook(lambda _m, _i, out: chosen["ours"].append(out[1]))
        for m in model.modules()
        if isinstance(m, MoE)
    ] + [
        layer.mlp.gate.register_forward_hook(lambda _m, _i, out: chosen["hf"].append(out[2]))
        for layer in hf_model.model.layers
    ]
    with torch.no_grad():
        gap = (model(tokens) - hf_model(tokens).logits).abs().max().item()
    for hook in hooks:
        hook.remove()
    assert gap <= 1e-5, gap
    assert len(chosen["ours"]) == len(chosen["hf"]) == args.n_layers
    for ours, theirs in zip(chosen["ours"], chosen["hf"]):
        assert torch.equal(ours, theirs)
