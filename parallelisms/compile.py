"""torch.compile per transformer block: blocks are identical, so one compiled graph serves all
of them, and compiling before FSDP keeps its communication outside the graph."""

from __future__ import annotations

from torch import nn


def apply_compile(blocks: list[nn.Module]) -> None:
    # Module.compile() compiles in place, so parameter names (and checkpoints) stay unchanged.
    for block in blocks:
        block.compile(fullgraph=True)
