"""What a checkpoint holds besides the loader and train state, as DCP `Stateful`s: the model (in
an export dtype for the final save, if asked), the optimizer (flattened: one key per parameter,
so that pipeline stages keep theirs) and the RNG."""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from titanlite.config.schema import CHECKPOINT_KEYS

KEYS = CHECKPOINT_KEYS


class ModelState(Stateful):
    def __init__(self, model: nn.Module, export_dtype: torch.dtype | None = None):
        self.model, self.export_dtype = model, export_dtype

    def state_dict(self) -> dict[str, Any]:
        sd: dict[str, Any] = get_model_state_dict(self.model)
        if self.export_dtype is not None:
            sd = {k: v.to(self.export_dtype) for k, v in sd.items()}
        return plain_tensors(sd)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_model_state_dict(self.model, state, options=StateDictOptions(strict=True))


class OptimizerState(Stateful):
    """Flattened: every hyperparameter is keyed by its parameter's name
    ("param_groups.<fqn>.lr"), not kept in one `param_groups` list. DCP keeps one copy of each
    key, so a list would be the list of one rank; pipeline stages hold different parameters,
    and the other stages' groups would be lost. `flatten = False` reads checkpoints written
    before (non-pipeline layouts only)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer
        self.flatten = True

    def state_dict(self) -> dict[str, Any]:
        options = StateDictOptions(flatten_optimizer_state_dict=self.flatten)
        return plain_tensors(get_optimizer_state_dict(self.model, self.optimizer, options=options))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        options = StateDictOptions(flatten_optimizer_state_dict=self.flatten)
        # torch 2.13's flattened load reads a group's hyperparameters through its first
        # parameter: a group without one fails (IndexError). A pipeline stage that holds just
        # the embedding has no 1-D parameter, so its no-decay group is empty; it is kept (every
        # rank has the same groups, which the LR scheduler's saved state assumes) but has
        # nothing to load, and is set aside meanwhile.
        groups = self.optimizer.param_groups
        self.optimizer.param_groups = [g for g in groups if g["params"]]
        try:
            set_optimizer_state_dict(self.model, self.optimizer, state, options=options)
        finally:
            loaded = iter(self.optimizer.param_groups)
            self.optimizer.param_groups = [next(loaded) if g["params"] else g for g in groups]


def plain_tensors(tree: Any) -> Any:
    """`tree` with every tensor subclass (inside DTensors too) replaced by a plain tensor of its
    values, sharing its memory. torch.save pickles a subclass by its class's import path, which
    torch.load's weights_only refuses unless the class was allowlisted: with the FSDP float8
    all-gather, a float8 run's shards are torchao's WeightWithDynamicFloat8CastTensor, and a
    checkpoint holding them would load only in a process that imported torchao (which
    allowlists it), not in a bf16 run, the converters or the export. A wrapper subclass unwraps
    to the inner tensor of its own shape, dtype and strides (torchao's `_tensor`)."""
    if isinstance(tree, dict):
        return {k: plain_tensors(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in tree):
        return type(tree)(plain_tensors(v) for v in tree)
    if isinstance(tree, DTensor):
        local = tree._local_tensor
        plain = _plain(local)
        if plain is local:
            return tree
        return DTensor.from_local(
            plain, tree.device_mesh, tree.placements, shape=tree.shape, stride=tree.stride()
        )
    return _plain(tree) if isinstance(tree, torch.Tensor) else tree


def _plain(t: torch.Tensor) -> torch.Tensor:
    if type(t) in (torch.Tensor, nn.Parameter):
        return t
    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        inner = getattr(t, names[0])
        if (inner.shape, inner.dtype, inner.stride()) == (t.shape, t.dtype, t.stride()):
            return _plain(inner)
        # Which of its tensors holds the values is the subclass's secret: refuse to guess.
        raise TypeError(
            f"cannot checkpoint a {type(t).__qualname__}: its first inner tensor "
            f"({names[0]}) is not its value; teach plain_tensors how to unwrap it"
        )
    return t.as_subclass(torch.Tensor)  # a plain-storage subclass: same memory, plain type


def optimizer_saved_flattened(saved_keys: Any) -> bool:
    """Whether a checkpoint's optimizer state is in the flattened form (titanlite's since
    pipeline parallel) rather than as `param_groups` lists, each naming its parameters (which DCP
    stores as "optimizer.param_groups.<group index>.params")."""
    return not any(re.fullmatch(r"optimizer\.param_groups\.\d+\.params", k) for k in saved_keys)


class RNGState(Stateful):
    """Every rank seeds alike, so rank 0's generator state stands for all (DCP dedups it)."""

    def state_dict(self) -> dict[str, Any]:
        state = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["cpu"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state(state["cuda"])
