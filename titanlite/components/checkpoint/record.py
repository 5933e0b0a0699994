"""What a checkpoint records about the run that wrote it (in its manifest): titanlite's version,
the model (name, flavor, args, tokenizer) and the config's hash, and how a recorded model
differs from a configured one. Shared by the manager, the converters and the resume checks."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any


def titanlite_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("titanlite")
    except PackageNotFoundError:
        return "unknown"


def model_config_record(
    name: str, flavor: str | None, args: Any, tokenizer: Path | str | None
) -> dict:
    """What a manifest records about the model (`model_config`), so that tools such as
    titanlite.components.checkpoint.hf know its shape without the run's config."""
    return {
        "name": name,
        "flavor": flavor,
        "args": args.to_dict(),
        "tokenizer": str(tokenizer) if tokenizer else None,
    }


def model_differences(saved: dict[str, Any], configured: dict[str, Any]) -> list[str]:
    """Model arguments that differ between a checkpoint's manifest and the configured model.
    Hyper-parameters that change the function but not the shapes (heads, RoPE, norm epsilon)
    escape the shape check; a checkpoint that records its model (e.g. one converted from
    Hugging Face) is compared field by field, for a warning, not an error: changing rope_theta
    to extend the context is a legitimate use. Not compared: what the shape check covers in
    other terms (the FFN width's recipe), the RoPE table's length, the init recipe, the
    attention kernel and mask, and where RoPE positions start."""

    def norm(args: dict[str, Any]) -> dict[str, Any]:
        args = {
            k: v
            for k, v in args.items()
            if k
            not in (
                "max_seq_len",
                "depth_init",
                "multiple_of",
                "ffn_dim_multiplier",
                # How attention is masked and computed may change between launches (the
                # weights fit either), and older manifests do not record it.
                "attn_type",
                "attn_mask_type",
                "rope_positions",
                "bos_id",
            )
        }
        if "n_kv_heads" in args:  # None means n_heads
            args["n_kv_heads"] = args["n_kv_heads"] or args.get("n_heads")
        return args

    saved, configured = norm(saved), norm(configured)
    return [
        f"{k} = {saved.get(k)} (checkpoint) vs {v} (configured)"
        for k, v in configured.items()
        if saved.get(k) != v
    ]


def config_hash(config_toml: str) -> str:
    return hashlib.sha256(config_toml.encode()).hexdigest()[:16]
