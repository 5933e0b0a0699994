"""Hugging Face `Qwen3ForCausalLM` / `Qwen3MoeForCausalLM` <-> titanlite Qwen3: parameter names,
the RoPE permutation of the q/k projections and of the q/k norms (`models.hf_common`), and
config.json, gathered in `HF`, the family's state-dict adapter. Pure functions of names,
tensors, dicts and Qwen3Args.

A tied model (tie_word_embeddings) has no `output.weight` in its state dict and Hugging Face's
files have no `lm_head.weight`: the one table is `embed_tokens`.

MoE: the router's gate is `mlp.gate`; the experts are stored as the published checkpoints (and
transformers 5's save_pretrained) hold them, one tensor per expert and projection
(`mlp.experts.{j}.gate_proj / up_proj / down_proj.weight`), stacked into titanlite's w13 (each
expert's gate rows then its up rows) and w2; a folder holding transformers' fused in-memory
tensors (`mlp.experts.gate_up_proj`, `down_proj`: save_original_format=False) is read too.
Qwen3 has no expert bias: `router.expert_bias` is not exported and imports as zeros."""

from __future__ import annotations

import re
from typing import Any

import torch

from models.hf_common import (
    decoder_config,
    field,
    meta_state_dict_shapes,
    permute_from_hf,
    permute_to_hf,
    rename,
    require,
    require_architecture,
)
from models.qwen3.args import Qwen3Args
from models.spec import HFAdapter, HFConfigError

_LABEL = "Qwen3"
_NAMES = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "layers.{i}.attention_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "layers.{i}.attention.wq.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "layers.{i}.attention.wk.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "layers.{i}.attention.wv.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "layers.{i}.attention.wo.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "layers.{i}.attention.q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",
    "layers.{i}.attention.k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight",
    "layers.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "layers.{i}.feed_forward.w1.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "layers.{i}.feed_forward.w3.weight": "model.layers.{i}.mlp.up_proj.weight",
    "layers.{i}.feed_forward.w2.weight": "model.layers.{i}.mlp.down_proj.weight",
    "layers.{i}.feed_forward.router.gate.weight": "model.layers.{i}.mlp.gate.weight",
    # transformers' in-memory (fused) experts; the files hold them per expert (split_names)
    "layers.{i}.feed_forward.experts.w13": "model.layers.{i}.mlp.experts.gate_up_proj",
    "layers.{i}.feed_forward.experts.w2": "model.layers.{i}.mlp.experts.down_proj",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_EXPERTS = re.compile(
    r"^layers\.(\d+)\.feed_forward\.(experts\.w13|experts\.w2|router\.expert_bias)$"
)
_PROJECTIONS = {"experts.w13": ("gate_proj", "up_proj"), "experts.w2": ("down_proj",)}
_FROM_HF = {v: k for k, v in _NAMES.items()}
HF_IGNORED = re.compile(r"^model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$")


def to_hf_name(key: str) -> str:
    return rename(key, _NAMES)


def from_hf_name(name: str) -> str:
    return rename(name, _FROM_HF)


def split_names(key: str, args: Qwen3Args) -> tuple[str, ...] | None:
    """An MoE layer's experts: one HF tensor per expert and projection (expert j's row of w13
    is its gate_proj then its up_proj); the expert bias: none."""
    m = _EXPERTS.match(key)
    if m is None:
        return None
    layer, what = m.groups()
    return tuple(
        f"model.layers.{layer}.mlp.experts.{j}.{proj}.weight"
        for j in range(args.moe_experts)
        for proj in _PROJECTIONS.get(what, ())
    )


def _permuted(key: str) -> bool:
    """The tensors whose rows are each head's entries in RoPE's order."""
    return key.endswith(
        ("attention.wq.weight", "attention.wk.weight", "q_norm.weight", "k_norm.weight")
    )


def to_hf_tensor(key: str, t: torch.Tensor, args: Qwen3Args) -> torch.Tensor:
    return permute_to_hf(t, t.shape[0] // args.head_dim) if _permuted(key) else t


def from_hf_tensor(key: str, t: torch.Tensor, args: Qwen3Args) -> torch.Tensor:
    """Of the whole tensor, or of rows that are whole heads (`row_group`)."""
    return permute_from_hf(t, t.shape[0] // args.head_dim) if _permuted(key) else t


def row_group(key: str, args: Qwen3Args) -> int:
    return args.head_dim if _permuted(key) else 1


def source_name(key: str, tied_embeddings: bool) -> str:
    # A tied titanlite model has no output.weight; an untied one from a tied folder (its args
    # say untied only if configured so) starts its head as a copy of the embedding.
    if tied_embeddings and key == "output.weight":
        return _NAMES["tok_embeddings.weight"]
    return to_hf_name(key)


def describe(args: Qwen3Args) -> str:
    tied = ", tied embeddings" if args.tie_word_embeddings else ""
    ffn = (
        f"FFN {args.ffn_hidden_dim}"
        if not args.moe_experts
        else f"{args.moe_experts} experts of {args.moe_hidden_dim}, {args.moe_top_k} per token"
    )
    return (
        f"dim {args.dim}, {args.n_layers} layers, {args.n_heads} heads of {args.head_dim}, "
        f"{args.kv_heads} kv heads, {ffn}, vocab {args.vocab_size}{tied}"
    )


def state_dict_shapes(args: Qwen3Args) -> dict[str, tuple[int, ...]]:
    from models.qwen3.model import Qwen3

    return meta_state_dict_shapes(Qwen3, args)


def hf_config(
    args: Qwen3Args,
    *,
    dtype: torch.dtype,
    max_position_embeddings: int | None = None,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
) -> dict[str, Any]:
    """config.json of `Qwen3ForCausalLM` (or, with experts, `Qwen3MoeForCausalLM`) for `args`,
    RoPE written both ways (`rope_theta`, transformers 4 and the published files;
    `rope_parameters`, transformers 5). HFConfigError for an MoE Qwen3 cannot hold."""
    theta = float(args.rope_theta)
    family = (
        _moe_config(args)
        if args.moe_experts
        else {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "max_window_layers": args.n_layers,
        }
    )
    return decoder_config(
        args,
        dtype=dtype,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        **family,
        max_position_embeddings=max_position_embeddings or args.max_seq_len,
        rope_theta=theta,
        rope_scaling=None,
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        tie_word_embeddings=args.tie_word_embeddings,
        use_sliding_window=False,
        sliding_window=None,
    )


def _moe_config(args: Qwen3Args) -> dict[str, Any]:
    """Qwen3MoeForCausalLM's own fields: every block an MoE (decoder_sparse_step 1, no
    mlp_only_layers)."""
    if args.moe_shared_hidden_dim or args.moe_score_func != "softmax":
        raise HFConfigError(
            f"the model has {'shared experts' if args.moe_shared_hidden_dim else 'sigmoid routing'}"
            ", which Qwen3MoeForCausalLM does not: it cannot be exported as Qwen3"
        )
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "num_experts": args.moe_experts,
        "num_experts_per_tok": args.moe_top_k,
        "moe_intermediate_size": args.moe_hidden_dim,
        "norm_topk_prob": args.moe_norm_topk_prob,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "router_aux_loss_coef": float(args.moe_aux_loss_coef),
        "output_router_logits": False,
    }


def _rope_theta(cfg: dict[str, Any]) -> float:
    """Plain RoPE only (the published dense models'); YaRN and other scalings are refused."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or params
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind != "default":
        where = "rope_scaling" if cfg.get("rope_scaling") else "rope_parameters"
        raise HFConfigError(
            f"config.json: {where}.rope_type = {kind!r}: titanlite's Qwen3 supports the "
            "default RoPE only"
        )
    return float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))


def args_from_hf_config(cfg: dict[str, Any]) -> Qwen3Args:
    """Qwen3Args for an HF config.json (qwen3 or qwen3_moe); HFConfigError names the first field
    titanlite's Qwen3 cannot represent."""
    require(cfg, "model_type", {"qwen3", "qwen3_moe"}, "'qwen3' or 'qwen3_moe'", _LABEL)
    moe = cfg["model_type"] == "qwen3_moe"
    require_architecture(cfg, "Qwen3MoeForCausalLM" if moe else "Qwen3ForCausalLM", _LABEL)
    require(cfg, "hidden_act", {"silu"}, "'silu'", _LABEL, "silu")
    require(cfg, "attention_bias", {False}, "false", _LABEL, False)
    require(cfg, "use_sliding_window", {False}, "false", _LABEL, False)
    n_heads = int(field(cfg, "num_attention_heads"))
    args = Qwen3Args(
        dim=int(field(cfg, "hidden_size")),
        n_layers=int(field(cfg, "num_hidden_layers")),
        n_heads=n_heads,
        n_kv_heads=int(field(cfg, "num_key_value_heads", n_heads)),
        head_dim=int(field(cfg, "head_dim", 128)),  # transformers' Qwen3Config default
        ffn_hidden_dim=int(field(cfg, "intermediate_size")),
        vocab_size=int(field(cfg, "vocab_size")),
        norm_eps=float(field(cfg, "rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(cfg),
        max_seq_len=int(field(cfg, "max_position_embeddings", 32768)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        **(_moe_args(cfg) if moe else {}),
    )
    try:
        args.check()
    except ValueError as e:
        raise HFConfigError(f"config.json: {e}") from None
    return args


def _moe_args(cfg: dict[str, Any]) -> dict[str, Any]:
    """Qwen3Args' moe_* fields of a qwen3_moe config.json (absent fields: transformers'
    Qwen3MoeConfig defaults; transformers 5 writes num_experts as num_local_experts)."""
    require(cfg, "decoder_sparse_step", {1}, "1 (titanlite makes every block MoE)", _LABEL, 1)
    if cfg.get("mlp_only_layers"):
        raise HFConfigError(
            f"config.json: mlp_only_layers = {cfg['mlp_only_layers']}: titanlite's Qwen3 makes "
            "every block MoE, it needs []"
        )
    experts = field(cfg, "num_experts", None)
    return {
        "moe_experts": int(
            experts if experts is not None else field(cfg, "num_local_experts", 128)
        ),
        "moe_top_k": int(field(cfg, "num_experts_per_tok", 8)),
        "moe_hidden_dim": int(field(cfg, "moe_intermediate_size", 768)),
        "moe_norm_topk_prob": bool(field(cfg, "norm_topk_prob", False)),
        "moe_aux_loss_coef": float(field(cfg, "router_aux_loss_coef", 1e-3)),
    }


HF = HFAdapter(
    label=_LABEL,
    model_types=("qwen3", "qwen3_moe"),
    embedding_key="tok_embeddings.weight",
    shape_fields=(
        "dim",
        "n_layers",
        "n_heads",
        "kv_heads",
        "head_dim",
        "vocab_size",
        "ffn_hidden_dim",
        "tie_word_embeddings",
        "moe_experts",
        "moe_hidden_dim",
    ),
    ignored=HF_IGNORED,
    describe=describe,
    state_dict_shapes=state_dict_shapes,
    to_hf_name=to_hf_name,
    source_name=source_name,
    to_hf_tensor=to_hf_tensor,
    from_hf_tensor=from_hf_tensor,
    row_group=row_group,
    hf_config=hf_config,
    args_from_hf_config=args_from_hf_config,
    split_names=split_names,
)
