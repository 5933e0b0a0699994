"""Hugging Face `DeepseekV3ForCausalLM` <-> titanlite DeepSeek-V3: parameter names, config.json,
and the MTP modules as the published checkpoint stores them. Pure functions of names, tensors,
dicts and DeepSeekV3Args, gathered in `HF`.

No RoPE permutation: DeepSeek's weights rotate adjacent pairs, as titanlite does (config.json's
`rope_interleave: true`, which transformers applies as such); a folder with `rope_interleave:
false` is refused.

MoE: the router's gate is `mlp.gate.weight`, the expert bias `mlp.gate.e_score_correction_bias`
(exported and imported: it steers the routing); the experts are one tensor per expert and
projection (`mlp.experts.{j}.gate_proj / up_proj / down_proj.weight`, as the published files and
transformers 5's save_pretrained hold them), stacked into titanlite's w13 and w2; a folder of
transformers' fused in-memory tensors (`mlp.experts.gate_up_proj`, `down_proj`) is read too.

MTP: module k is HF's `model.layers.{n_layers + k}`: `enorm`, `hnorm`, `eh_proj`,
`shared_head.norm` and the block's own names. The published checkpoint also stores copies of the
embedding and the head there (`embed_tokens`, `shared_head.head`); titanlite shares the main
model's, so it ignores them on import and does not write them (transformers' `MtpModel` ties
them to the main model's). `num_nextn_predict_layers` is mtp_depth both ways."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import torch

from models.deepseek_v3.args import DeepSeekV3Args
from models.hf_common import (
    decoder_config,
    field,
    meta_state_dict_shapes,
    require,
    require_architecture,
)
from models.spec import HFAdapter, HFConfigError

_LABEL = "DeepSeek-V3"
_BLOCK = {
    "attention_norm.weight": "input_layernorm.weight",
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wq_a.weight": "self_attn.q_a_proj.weight",
    "attention.q_norm.weight": "self_attn.q_a_layernorm.weight",
    "attention.wq_b.weight": "self_attn.q_b_proj.weight",
    "attention.wkv_a.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attention.kv_norm.weight": "self_attn.kv_a_layernorm.weight",
    "attention.wkv_b.weight": "self_attn.kv_b_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "feed_forward.router.gate.weight": "mlp.gate.weight",
    "feed_forward.router.expert_bias": "mlp.gate.e_score_correction_bias",
    "feed_forward.experts.w13": "mlp.experts.gate_up_proj",
    "feed_forward.experts.w2": "mlp.experts.down_proj",
    "feed_forward.shared_experts.w1.weight": "mlp.shared_experts.gate_proj.weight",
    "feed_forward.shared_experts.w3.weight": "mlp.shared_experts.up_proj.weight",
    "feed_forward.shared_experts.w2.weight": "mlp.shared_experts.down_proj.weight",
}
_MTP_OWN = {
    "enorm.weight": "enorm.weight",
    "hnorm.weight": "hnorm.weight",
    "eh_proj.weight": "eh_proj.weight",
    "norm.weight": "shared_head.norm.weight",
}
_TOP = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER = re.compile(r"^(layers|mtp)\.(\d+)\.(.+)$")
_EXPERTS = re.compile(r"^(.*)feed_forward\.(experts\.w13|experts\.w2)$")
_PROJECTIONS = {"experts.w13": ("gate_proj", "up_proj"), "experts.w2": ("down_proj",)}
HF_IGNORED = re.compile(
    r"^model\.layers\.\d+\.(embed_tokens\.weight|shared_head\.head\.weight|"
    r"self_attn\.rotary_emb\.inv_freq)$"
)


def to_hf_name(key: str) -> str:
    """An MTP module is keyed by its HF layer number (n_layers + k), as blocks are by theirs."""
    if key in _TOP:
        return _TOP[key]
    m = _LAYER.match(key)
    if m is None:
        raise KeyError(key)
    where, layer, rest = m.groups()
    if where == "mtp":
        if rest in _MTP_OWN:
            return f"model.layers.{layer}.{_MTP_OWN[rest]}"
        if not rest.startswith("block."):
            raise KeyError(key)
        rest = rest.removeprefix("block.")
    if rest not in _BLOCK:
        raise KeyError(key)
    return f"model.layers.{layer}.{_BLOCK[rest]}"


def split_names(key: str, args: DeepSeekV3Args) -> tuple[str, ...] | None:
    """A routed-experts tensor: one HF tensor per expert and projection (expert j's row of w13
    is its gate_proj then its up_proj)."""
    m = _EXPERTS.match(key)
    if m is None:
        return None
    hf = to_hf_name(key)  # ...mlp.experts.gate_up_proj / down_proj
    base = hf.rsplit(".", 1)[0]
    return tuple(
        f"{base}.{j}.{proj}.weight"
        for j in range(args.moe_experts)
        for proj in _PROJECTIONS[m.group(2)]
    )


def _source_name(key: str, tied_embeddings: bool) -> str:
    return to_hf_name(key)  # the head is never the embedding here


def _identity(key: str, t: torch.Tensor, args: DeepSeekV3Args) -> torch.Tensor:
    return t


def _row_group(key: str, args: DeepSeekV3Args) -> int:
    return 1


def describe(args: DeepSeekV3Args) -> str:
    q = f"q latent {args.q_lora_rank}" if args.q_lora_rank else "no q latent"
    moe = (
        f"{args.moe_experts} experts of {args.moe_hidden_dim}, {args.moe_top_k} per token, "
        f"{args.moe_shared_experts} shared, {args.n_dense_layers} dense first"
        if args.moe_experts
        else f"FFN {args.ffn_hidden_dim}"
    )
    return (
        f"dim {args.dim}, {args.n_layers} layers, {args.n_heads} heads, {q}, kv latent "
        f"{args.kv_lora_rank}, head dims {args.qk_nope_head_dim}+{args.qk_rope_head_dim}/"
        f"{args.v_head_dim}, {moe}, MTP depth {args.mtp_depth}, vocab {args.vocab_size}"
    )


def state_dict_shapes(args: DeepSeekV3Args) -> dict[str, tuple[int, ...]]:
    from models.deepseek_v3.model import DeepSeekV3

    return meta_state_dict_shapes(DeepSeekV3, args)


def _rope_parameters(args: DeepSeekV3Args) -> dict[str, Any]:
    theta = float(args.rope_theta)
    if args.rope_factor <= 1:
        return {"rope_type": "default", "rope_theta": theta}
    return {
        "rope_type": "yarn",
        "rope_theta": theta,
        "factor": float(args.rope_factor),
        "original_max_position_embeddings": args.rope_original_max_seq_len,
        "beta_fast": float(args.rope_beta_fast),
        "beta_slow": float(args.rope_beta_slow),
        "mscale": float(args.rope_mscale),
        "mscale_all_dim": float(args.rope_mscale_all_dim),
    }


def hf_config(
    args: DeepSeekV3Args,
    *,
    dtype: torch.dtype,
    max_position_embeddings: int | None = None,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
) -> dict[str, Any]:
    """config.json of `DeepseekV3ForCausalLM`; HFConfigError for what it cannot hold."""
    if args.moe_experts and args.moe_score_func != "sigmoid":
        raise HFConfigError(
            "the model routes by softmax; DeepseekV3ForCausalLM routes by sigmoid scores "
            "(DeepSeek-V2's models are model_type deepseek_v2): it cannot be exported as "
            "DeepSeek-V3"
        )
    if args.moe_experts and args.moe_load_balance != "expert_bias":
        raise HFConfigError(
            f"moe_load_balance = {args.moe_load_balance!r}: DeepseekV3ForCausalLM adds the "
            "expert bias to the routing scores, which the model was not trained with; train "
            "with 'expert_bias' to export as DeepSeek-V3"
        )
    rope = _rope_parameters(args)
    return decoder_config(
        args,
        dtype=dtype,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        architectures=["DeepseekV3ForCausalLM"],
        model_type="deepseek_v3",
        moe_intermediate_size=args.moe_hidden_dim,
        n_shared_experts=args.moe_shared_experts,
        n_routed_experts=args.moe_experts,
        num_experts_per_tok=args.moe_top_k,
        routed_scaling_factor=float(args.moe_routed_scaling_factor),
        n_group=args.moe_n_group,
        topk_group=args.moe_topk_group,
        norm_topk_prob=args.moe_norm_topk_prob,
        scoring_func="sigmoid",
        topk_method="noaux_tc",
        first_k_dense_replace=args.n_dense_layers,
        kv_lora_rank=args.kv_lora_rank,
        q_lora_rank=args.q_lora_rank or None,
        qk_nope_head_dim=args.qk_nope_head_dim,
        qk_rope_head_dim=args.qk_rope_head_dim,
        v_head_dim=args.v_head_dim,
        num_nextn_predict_layers=args.mtp_depth,
        max_position_embeddings=max_position_embeddings or args.max_seq_len,
        rope_theta=float(args.rope_theta),
        rope_scaling=None if rope["rope_type"] == "default" else _v3_rope_scaling(rope),
        rope_parameters=rope,
        rope_interleave=True,
        tie_word_embeddings=False,
    )


def _v3_rope_scaling(rope: dict[str, Any]) -> dict[str, Any]:
    """rope_parameters as the published config.json's rope_scaling spells them."""
    out = {k: v for k, v in rope.items() if k not in ("rope_type", "rope_theta")}
    return {**out, "type": "yarn"}


def _rope_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or params
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    if kind == "default":
        return {"rope_theta": theta, "rope_factor": 1.0}
    if kind != "yarn":
        raise HFConfigError(
            f"config.json: rope_type = {kind!r}: titanlite's {_LABEL} supports 'default' and 'yarn'"
        )
    return {
        "rope_theta": theta,
        "rope_factor": float(field(scaling, "factor")),
        "rope_original_max_seq_len": int(field(scaling, "original_max_position_embeddings")),
        "rope_beta_fast": float(scaling.get("beta_fast") or 32.0),
        "rope_beta_slow": float(scaling.get("beta_slow") or 1.0),
        "rope_mscale": float(scaling.get("mscale") or 0.0),
        "rope_mscale_all_dim": float(scaling.get("mscale_all_dim") or 0.0),
    }


def args_from_hf_config(cfg: dict[str, Any]) -> DeepSeekV3Args:
    """DeepSeekV3Args for an HF config.json; HFConfigError names the first field titanlite's
    DeepSeek-V3 cannot represent."""
    require(cfg, "model_type", {"deepseek_v3"}, "'deepseek_v3'", _LABEL)
    require_architecture(cfg, "DeepseekV3ForCausalLM", _LABEL)
    require(cfg, "hidden_act", {"silu"}, "'silu'", _LABEL, "silu")
    require(cfg, "attention_bias", {False}, "false", _LABEL, False)
    require(cfg, "rope_interleave", {True}, "true (DeepSeek's own layout)", _LABEL, True)
    require(cfg, "tie_word_embeddings", {False}, "false", _LABEL, False)
    n_heads = int(field(cfg, "num_attention_heads"))
    require(
        cfg, "num_key_value_heads", {n_heads}, f"num_attention_heads ({n_heads})", _LABEL, n_heads
    )
    experts = int(field(cfg, "n_routed_experts", 256))
    args = DeepSeekV3Args(
        dim=int(field(cfg, "hidden_size")),
        n_layers=int(field(cfg, "num_hidden_layers")),
        n_heads=n_heads,
        q_lora_rank=int(field(cfg, "q_lora_rank", 0)),
        kv_lora_rank=int(field(cfg, "kv_lora_rank", 512)),
        qk_nope_head_dim=int(field(cfg, "qk_nope_head_dim", 128)),
        qk_rope_head_dim=int(field(cfg, "qk_rope_head_dim", 64)),
        v_head_dim=int(field(cfg, "v_head_dim", 128)),
        ffn_hidden_dim=int(field(cfg, "intermediate_size")),
        first_k_dense_replace=int(field(cfg, "first_k_dense_replace", 3)),
        moe_experts=experts,
        moe_top_k=int(field(cfg, "num_experts_per_tok", 8)),
        moe_hidden_dim=int(field(cfg, "moe_intermediate_size", 2048)),
        moe_shared_experts=int(field(cfg, "n_shared_experts", 1)),
        moe_norm_topk_prob=bool(field(cfg, "norm_topk_prob", True)),
        moe_routed_scaling_factor=float(field(cfg, "routed_scaling_factor", 2.5)),
        moe_n_group=int(field(cfg, "n_group", 8)),
        moe_topk_group=int(field(cfg, "topk_group", 4)),
        mtp_depth=int(field(cfg, "num_nextn_predict_layers", 0)),
        vocab_size=int(field(cfg, "vocab_size")),
        norm_eps=float(field(cfg, "rms_norm_eps", 1e-6)),
        max_seq_len=int(field(cfg, "max_position_embeddings", 4096)),
        **_rope_fields(cfg),
    )
    try:
        args.check()
    except ValueError as e:
        raise HFConfigError(f"config.json: {e}") from None
    return args


def fit_tensors(args: DeepSeekV3Args, names: set[str]) -> DeepSeekV3Args:
    """A folder without the MTP modules' tensors holds the main model only, whatever
    num_nextn_predict_layers says (transformers' save_pretrained writes no MTP module and its
    config counts one by default)."""
    held = sum(
        f"model.layers.{args.n_layers + k}.eh_proj.weight" in names for k in range(args.mtp_depth)
    )
    return args if held == args.mtp_depth else replace(args, mtp_depth=held)


def inference_args(args: DeepSeekV3Args) -> DeepSeekV3Args:
    """The main model: what generation and lm-eval run (transformers' DeepseekV3ForCausalLM
    skips an MTP layer it finds)."""
    return replace(args, mtp_depth=0)


HF = HFAdapter(
    label=_LABEL,
    model_types=("deepseek_v3",),
    embedding_key="tok_embeddings.weight",
    shape_fields=(
        "dim",
        "n_layers",
        "n_heads",
        "q_lora_rank",
        "kv_lora_rank",
        "qk_nope_head_dim",
        "qk_rope_head_dim",
        "v_head_dim",
        "vocab_size",
        "ffn_hidden_dim",
        "first_k_dense_replace",
        "moe_experts",
        "moe_hidden_dim",
        "moe_shared_experts",
        "mtp_depth",
    ),
    ignored=HF_IGNORED,
    describe=describe,
    state_dict_shapes=state_dict_shapes,
    to_hf_name=to_hf_name,
    source_name=_source_name,
    to_hf_tensor=_identity,
    from_hf_tensor=_identity,
    row_group=_row_group,
    hf_config=hf_config,
    args_from_hf_config=args_from_hf_config,
    split_names=split_names,
    fit_tensors=fit_tensors,
    inference_args=inference_args,
)
