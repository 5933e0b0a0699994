"""torch.compile per transformer block: blocks are identical, so one compiled graph serves all
of them, and compiling before FSDP keeps its communication outside the graph."""

from __future__ import annotations

from torch import nn


def apply_compile(blocks: list[nn.Module], graphs_hold_collectives: bool) -> None:
    if graphs_hold_collectives:
        # With tensor parallel the graphs contain collectives that name their process group,
        # and torch 2.13's on-disk graph caches do not key on that name: a graph cached by a run
        # with another layout (or group creation order) fails with "Could not resolve the
        # process group registered under the name N". Seen here; recompiling is the safe price.
        import torch._functorch.config as functorch_config
        import torch._inductor.config as inductor_config

        inductor_config.fx_graph_cache = False
        functorch_config.enable_autograd_cache = False
        # Such graphs take the device mesh and process group as inputs, opaque objects whose
        # size the min-cut partitioner refuses to guess when it weighs a memory budget between
        # 0 and 1 ("Cannot compute the size of FakeScriptObject", seen with TP); they are
        # references to communicators and hold no activations, so zero is their true size.
        functorch_config.unsafe_treat_script_objects_as_zero_size = True
    # Module.compile() compiles in place, so parameter names (and checkpoints) stay unchanged.
    for block in blocks:
        block.compile(fullgraph=True)
