"""Which parameters Muon steps and which AdamW does, by the parameter's role, the same rule for
every family and layout (names are the whole model's, whatever wraps the blocks).

Muon is an optimizer for hidden matrices: a layer's input-to-output map, whose update it makes
orthogonal. Left to AdamW, always: vectors (norm gains, biases), embeddings (rows looked up one
token at a time, not a map of the residual stream), the output head (a classifier over the
vocabulary, as Muon's authors and Moonlight keep it on AdamW) and the MoE routers' gates (a
classifier over experts, read as logits). `optimizer.muon_exclude` adds fnmatch patterns."""

from __future__ import annotations

from collections.abc import Iterator
from fnmatch import fnmatchcase

import torch
from torch import nn

# The head of every family is `output`; routers are `...feed_forward.router` (models/moe.py).
ALWAYS_ADAMW = ("output.weight", "*.router.*")
# The experts' fused w13: each expert's gate rows, then its up rows (models/moe.py), two
# matrices to orthogonalize one by one.
TWO_MATRICES = ("*.experts.w13",)
_WRAPPERS = ("_checkpoint_wrapped_module", "_orig_mod")


def plain_name(name: str) -> str:
    """A parameter's or module's name without the wrappers' parts (activation checkpointing,
    compile): the name checkpoints and configs use."""
    return ".".join(part for part in name.split(".") if part not in _WRAPPERS)


def trainable(model: nn.Module) -> Iterator[tuple[str, nn.Parameter, nn.Module]]:
    """(plain name, parameter, the module that owns it) for every trainable parameter."""
    for module_name, module in model.named_modules():
        for name, p in module.named_parameters(recurse=False):
            if p.requires_grad:
                yield plain_name(f"{module_name}.{name}" if module_name else name), p, module


def uses_muon(name: str, p: torch.Tensor, owner: nn.Module, exclude: list[str]) -> bool:
    if p.dim() < 2 or isinstance(owner, nn.Embedding):
        return False
    return not any(fnmatchcase(name, pattern) for pattern in (*ALWAYS_ADAMW, *exclude))


def row_blocks(name: str) -> int:
    return 2 if any(fnmatchcase(name, pattern) for pattern in TWO_MATRICES) else 1


def split_summary(model: nn.Module, exclude: list[str]) -> str:
    """The split, for the log: how many tensors and parameters each optimizer steps."""
    counts = {True: [0, 0], False: [0, 0]}
    for name, p, owner in trainable(model):
        side = counts[uses_muon(name, p, owner, exclude)]
        side[0] += 1
        side[1] += p.numel()
    (m, m_numel), (a, a_numel) = counts[True], counts[False]
    return (
        f"Muon steps {m} matrices ({m_numel:,} parameters), AdamW {a} tensors ({a_numel:,}: "
        "embeddings, the output head, routers, vectors"
        + (f", and optimizer.muon_exclude {exclude}" if exclude else "")
        + ")"
    )
