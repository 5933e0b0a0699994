"""What the rest of titanlite needs to know about a model family, without any parallel code."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch


class ModelArgs(Protocol):
    """What the rest of titanlite reads of a family's hyper-parameters (a frozen dataclass)."""

    @property
    def n_layers(self) -> int: ...  # the pipeline splits blocks over stages

    def to_dict(self) -> dict[str, object]: ...  # what a checkpoint's manifest records


class TrainableModel(Protocol):
    """What the trainer calls on a family's model besides nn.Module's own methods."""

    def init_weights(self, seed: int, buffer_device: torch.device | None = None) -> None: ...


@dataclass(frozen=True)
class ModelSpec:
    name: str
    flavors: dict[str, Any]  # flavor name -> the family's args dataclass
    model_cls: type
    num_params: Callable[..., int]
    training_flops_per_token: Callable[[Any, int], int]
