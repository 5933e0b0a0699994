"""What the families' Hugging Face adapters share: renaming keys by a table with the layer
number as `{i}`, the RoPE q/k row permutation, and reading config.json fields with errors that
name the field (`HFConfigError`).

RoPE: titanlite rotates adjacent pairs (x[2k], x[2k+1]) of each head as complex numbers (Meta's
original layout); Hugging Face rotates the halves (x[k], x[k + head_dim/2]) (`rotate_half`).
So the rows of the q and k projections are permuted within each head: HF row j*head_dim/2 + k
is titanlite row 2k + j. q and k are permuted alike, so q.k is unchanged and v, o need nothing.
A weight applied to each head's entries before RoPE (Qwen3's q_norm / k_norm) is permuted as
one head.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from models.spec import HFConfigError

_LAYER = re.compile(r"(?<=layers\.)(\d+)(?=\.)")


def rename(key: str, table: dict[str, str]) -> str:
    """`key` renamed by `table` (templates with `{i}` for the layer number); KeyError if the
    table has no entry for it."""
    template = _LAYER.sub("{i}", key, count=1)
    if template not in table:
        raise KeyError(key)
    m = _LAYER.search(key)
    return table[template].format(i=m.group(1) if m else "")


def permute_to_hf(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rows of a q/k projection from interleaved pairs (titanlite) to halves (HF), per head."""
    if w.dim() == 1:
        return permute_to_hf(w[:, None], n_heads)[:, 0]
    rows, cols = w.shape
    return w.view(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def permute_from_hf(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The inverse of permute_to_hf."""
    if w.dim() == 1:
        return permute_from_hf(w[:, None], n_heads)[:, 0]
    rows, cols = w.shape
    return w.view(n_heads, 2, rows // n_heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def field(cfg: dict[str, Any], name: str, default: Any = KeyError) -> Any:
    """config.json's `name`; its default when absent or null, HFConfigError without one."""
    if name in cfg and cfg[name] is not None:
        return cfg[name]
    if default is KeyError:
        raise HFConfigError(f"config.json has no {name}")
    return default


def require(
    cfg: dict[str, Any], name: str, ok: Any, expected: str, label: str, default: Any = None
) -> None:
    """HFConfigError unless config.json's `name` (or `default`) is one of `ok`."""
    value = cfg.get(name, default)
    if value is None:
        value = default
    if value not in ok:
        raise HFConfigError(
            f"config.json: {name} = {value!r}: titanlite's {label} needs {expected}"
        )


def require_architecture(cfg: dict[str, Any], architecture: str, label: str) -> None:
    archs = cfg.get("architectures") or [architecture]
    if architecture not in archs:
        raise HFConfigError(
            f"config.json: architectures = {archs}: titanlite's {label} needs {architecture}"
        )


def meta_state_dict_shapes(model_cls: Any, args: Any) -> dict[str, tuple[int, ...]]:
    """Every entry of the titanlite model's state dict for `args`, in order, with its shape (from
    the model itself, built on the meta device: no memory, no drift from the model's code)."""
    with torch.device("meta"):
        model = model_cls(args)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def decoder_config(
    args: Any,
    *,
    dtype: torch.dtype,
    bos_token_id: int | None,
    eos_token_id: int | None,
    **family: Any,
) -> dict[str, Any]:
    """config.json: the keys every decoder family writes alike (shapes, activation, norms, no
    biases, dtype, special tokens), with the family's own (`architectures`, `model_type`, RoPE,
    ...) first."""
    cfg: dict[str, Any] = {
        **family,
        "hidden_size": args.dim,
        "intermediate_size": args.ffn_hidden_dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.kv_heads,
        "head_dim": args.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": float(args.norm_eps),
        "vocab_size": args.vocab_size,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    if bos_token_id is not None:
        cfg["bos_token_id"] = bos_token_id
    if eos_token_id is not None:
        cfg["eos_token_id"] = eos_token_id
    return cfg
