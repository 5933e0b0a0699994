"""Model definitions, free of any parallelism code, and a registry by `model.name`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from models import llama


@dataclass(frozen=True)
class ModelSpec:
    name: str
    flavors: dict[str, Any]
    model_cls: type
    num_params: Callable[..., int]
    training_flops_per_token: Callable[[Any, int], int]


MODELS: dict[str, ModelSpec] = {
    "llama3": ModelSpec(
        "llama3",
        llama.FLAVORS,
        llama.Transformer,
        llama.num_params,
        llama.training_flops_per_token,
    ),
}
