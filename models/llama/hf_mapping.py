"""Hugging Face `LlamaForCausalLM` <-> titanlite Llama: parameter names, the RoPE q/k
permutation (`models.hf_common`) and the config, gathered in `HF`, the family's state-dict
adapter (the family record's `hf`). Pure functions of names, tensors, dicts and LlamaArgs; the
files (DCP, safetensors) are titanlite.components.checkpoint.hf's business.
"""

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
from models.llama.args import FLAVORS, LlamaArgs
from models.spec import HFAdapter, HFConfigError

# titanlite key -> HF key; {i} is the layer number.
_NAMES = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "layers.{i}.attention_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "layers.{i}.attention.wq.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "layers.{i}.attention.wk.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "layers.{i}.attention.wv.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "layers.{i}.attention.wo.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "layers.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "layers.{i}.feed_forward.w1.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "layers.{i}.feed_forward.w3.weight": "model.layers.{i}.mlp.up_proj.weight",
    "layers.{i}.feed_forward.w2.weight": "model.layers.{i}.mlp.down_proj.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_TO_HF = _NAMES
_FROM_HF = {v: k for k, v in _NAMES.items()}
# The context of the Llama 3.1 flavors (the LlamaArgs default), which their RoPE scaling serves.
LLAMA31_CONTEXT = LlamaArgs().max_seq_len
# Non-parameter buffers some older HF checkpoints carry; derived from the config, never loaded.
HF_IGNORED = re.compile(r"^model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$")


def to_hf_name(key: str) -> str:
    """titanlite state-dict key -> HF key (KeyError for a key that is not a Llama parameter)."""
    return rename(key, _TO_HF)


def from_hf_name(name: str) -> str:
    """HF key -> titanlite state-dict key (KeyError for a key that is not a Llama parameter)."""
    return rename(name, _FROM_HF)


def _heads(key: str, args: LlamaArgs) -> int | None:
    if key.endswith("attention.wq.weight"):
        return args.n_heads
    if key.endswith("attention.wk.weight"):
        return args.kv_heads
    return None


def hf_source_name(key: str, tied_embeddings: bool) -> str:
    """The HF tensor that titanlite parameter `key` is read from: with tie_word_embeddings (as
    Llama 3.2 1B/3B), the untied output head starts as a copy of the embedding."""
    if tied_embeddings and key == "output.weight":
        return _NAMES["tok_embeddings.weight"]
    return to_hf_name(key)


def to_hf_tensor(key: str, t: torch.Tensor, args: LlamaArgs) -> torch.Tensor:
    """The HF value of titanlite parameter `key` (a view where no permutation is needed)."""
    heads = _heads(key, args)
    return t if heads is None else permute_to_hf(t, heads)


def row_group(key: str, args: LlamaArgs) -> int:
    """Rows that the conversion of parameter `key` permutes among themselves: a head's of q/k."""
    return 1 if _heads(key, args) is None else args.head_dim


def from_hf_tensor(key: str, t: torch.Tensor, args: LlamaArgs) -> torch.Tensor:
    """The titanlite value of parameter `key` (titanlite name) from its HF tensor, or from rows
    of it that are whole heads (`row_group`), as a rank reads its shard."""
    return t if _heads(key, args) is None else permute_from_hf(t, t.shape[0] // args.head_dim)


def describe(args: LlamaArgs) -> str:
    return (
        f"dim {args.dim}, {args.n_layers} layers, {args.n_heads} heads, {args.kv_heads} kv "
        f"heads, vocab {args.vocab_size}"
    )


def state_dict_shapes(args: LlamaArgs) -> dict[str, tuple[int, ...]]:
    from models.llama.model import Transformer

    return meta_state_dict_shapes(Transformer, args)


# ---------------------------------------------------------------------------------------------
# config


def hf_config(
    args: LlamaArgs,
    *,
    dtype: torch.dtype,
    max_position_embeddings: int | None = None,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
) -> dict[str, Any]:
    """The config.json of `LlamaForCausalLM` for `args`. RoPE is written both ways: `rope_theta`
    + `rope_scaling` (transformers 4.x, the published Llama 3.1 files) and `rope_parameters`
    (transformers 5). `max_position_embeddings` defaults to args.max_seq_len (for a trained
    checkpoint: its training sequence length), raised to Llama 3.1's 131072 when the model uses
    Llama 3.1 RoPE scaling (the context that scaling is for; transformers also wants it above
    the scaling's original context)."""
    rope_scaling = None
    if args.rope_scaling is not None:
        factor, low, high, ctx = args.rope_scaling
        rope_scaling = {
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": low,
            "high_freq_factor": high,
            "original_max_position_embeddings": ctx,
        }
    if max_position_embeddings is None:
        max_position_embeddings = max(args.max_seq_len, LLAMA31_CONTEXT if args.rope_scaling else 0)
    theta = float(args.rope_theta)
    rope_parameters = (
        {"rope_type": "default", "rope_theta": theta}
        if rope_scaling is None
        else {**rope_scaling, "rope_theta": theta}
    )
    return decoder_config(
        args,
        dtype=dtype,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        max_position_embeddings=max_position_embeddings,
        rope_theta=theta,
        rope_scaling=rope_scaling,
        rope_parameters=rope_parameters,
        tie_word_embeddings=False,
        mlp_bias=False,
        pretraining_tp=1,
    )


def _rope(cfg: dict[str, Any]) -> tuple[float, tuple[float, float, float, int] | None]:
    """(rope_theta, Llama 3.1 scaling or None) from transformers 5's rope_parameters or 4's
    rope_theta + rope_scaling."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or None
    if scaling is None and params.get("rope_type", params.get("type", "default")) != "default":
        scaling = params
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    if scaling is None:
        return float(theta), None
    kind = scaling.get("rope_type", scaling.get("type"))
    where = "rope_scaling" if cfg.get("rope_scaling") else "rope_parameters"
    if kind == "default":
        return float(theta), None
    if kind != "llama3":
        raise HFConfigError(
            f"config.json: {where}.rope_type = {kind!r}: titanlite's Llama supports "
            "the default RoPE and Llama 3.1's 'llama3' scaling only"
        )
    try:
        ctx = scaling.get("original_max_position_embeddings", cfg.get("max_position_embeddings"))
        return float(theta), (
            float(scaling["factor"]),
            float(scaling["low_freq_factor"]),
            float(scaling["high_freq_factor"]),
            int(ctx),
        )
    except (KeyError, TypeError) as e:
        raise HFConfigError(f"config.json: {where} (llama3) lacks {e}") from None


def _ffn_args(dim: int, hidden: int) -> tuple[int, float | None]:
    """(multiple_of, ffn_dim_multiplier) that give FFN width `hidden` for `dim`: a flavor's or
    the default pair when one fits, else an exact pair."""
    candidates = [(f.multiple_of, f.ffn_dim_multiplier) for f in FLAVORS.values()]
    base = int(2 * (4 * dim) / 3)
    candidates.append((hidden, None if base <= hidden else hidden / base))
    for multiple_of, mult in candidates:
        if (
            LlamaArgs(dim=dim, multiple_of=multiple_of, ffn_dim_multiplier=mult).ffn_hidden_dim
            == hidden
        ):
            return multiple_of, mult
    raise HFConfigError(
        f"config.json: intermediate_size = {hidden} cannot be expressed"
    )  # unreachable


def args_from_hf_config(cfg: dict[str, Any]) -> LlamaArgs:
    """LlamaArgs for an HF config.json; HFConfigError names the first field titanlite's Llama
    cannot represent."""
    require(cfg, "model_type", {"llama"}, "'llama'", "Llama")
    require_architecture(cfg, "LlamaForCausalLM", "Llama")
    require(cfg, "hidden_act", {"silu"}, "'silu'", "Llama", "silu")
    require(cfg, "attention_bias", {False}, "false", "Llama", False)
    require(cfg, "mlp_bias", {False}, "false", "Llama", False)
    dim, n_heads = int(field(cfg, "hidden_size")), int(field(cfg, "num_attention_heads"))
    if dim % n_heads:
        raise HFConfigError(
            f"config.json: hidden_size = {dim} is not divisible by num_attention_heads = {n_heads}"
        )
    head_dim = field(cfg, "head_dim", dim // n_heads)
    if head_dim != dim // n_heads:
        raise HFConfigError(
            f"config.json: head_dim = {head_dim}: titanlite's Llama needs "
            f"hidden_size / num_attention_heads = {dim // n_heads}"
        )
    theta, scaling = _rope(cfg)
    multiple_of, mult = _ffn_args(dim, int(field(cfg, "intermediate_size")))
    args = LlamaArgs(
        dim=dim,
        n_layers=int(field(cfg, "num_hidden_layers")),
        n_heads=n_heads,
        n_kv_heads=int(field(cfg, "num_key_value_heads", n_heads)),
        vocab_size=int(field(cfg, "vocab_size")),
        multiple_of=multiple_of,
        ffn_dim_multiplier=mult,
        norm_eps=float(field(cfg, "rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_seq_len=int(field(cfg, "max_position_embeddings", 2048)),
    )
    try:
        args.check()
    except ValueError as e:
        raise HFConfigError(f"config.json: {e}") from None
    return args


HF = HFAdapter(
    label="Llama",
    model_types=("llama",),
    embedding_key="tok_embeddings.weight",
    shape_fields=("dim", "n_layers", "n_heads", "kv_heads", "vocab_size", "ffn_hidden_dim"),
    ignored=HF_IGNORED,
    describe=describe,
    state_dict_shapes=state_dict_shapes,
    to_hf_name=to_hf_name,
    source_name=hf_source_name,
    to_hf_tensor=to_hf_tensor,
    from_hf_tensor=from_hf_tensor,
    row_group=row_group,
    hf_config=hf_config,
    args_from_hf_config=args_from_hf_config,
)
