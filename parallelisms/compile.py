"""torch.compile per transformer block: blocks are identical, so one compiled graph serves all
of them, and compiling before FSDP keeps its communication outside the graph.

Each block is one graph (fullgraph), except under expert parallel: its token dispatch reads the
all-to-all's split sizes on the host and runs eagerly (parallelisms/expert_parallel.py), so an
MoE block compiles as the graphs before and after it."""

from __future__ import annotations

from torch import nn


def apply_compile(
    blocks: list[nn.Module], graphs_hold_collectives: bool, breaks_at_dispatch: bool = False
) -> None:
    if graphs_hold_collectives:
        import torch._functorch.config as functorch_config

        # Under tensor or context parallel the traced graphs bake in the rank's place in the
        # device mesh (its vocabulary offset under loss parallel, its group names), and torch
        # 2.13's AOTAutograd cache key hashes a DeviceMesh by its type alone: rank 1 loaded
        # rank 0's compiled loss, and its step-1 loss was 4.2432 instead of 6.7515 (TP 2,
        # docs/parallelism.md). Inductor's FX graph cache stays on: its key holds the traced
        # graph and each mesh's pickled state, so a hit is this rank's graph.
        functorch_config.enable_autograd_cache = False
        _stable_mesh_pickles()
        # Such graphs take the device mesh and process group as inputs, opaque objects whose
        # size the min-cut partitioner refuses to guess when it weighs a memory budget between
        # 0 and 1 ("Cannot compute the size of FakeScriptObject", seen with TP); they are
        # references to communicators and hold no activations, so zero is their true size.
        functorch_config.unsafe_treat_script_objects_as_zero_size = True
    # Module.compile() compiles in place, so parameter names (and checkpoints) stay unchanged.
    for block in blocks:
        block.compile(fullgraph=not breaks_at_dispatch)


def _stable_mesh_pickles() -> None:
    """A DeviceMesh pickles the `_hash` it caches from Python's hash(), which differs from one
    process to the next, and the FX graph cache key pickles each mesh a graph takes: every
    launch missed the cache (4 of 4 graphs per rank on a second TP 2 launch). Dropped from the
    pickled state, the key is the same in every launch; the mesh's hash itself is unchanged
    (recomputed on demand after unpickling, where the cached one would be wrong anyway)."""
    from torch.distributed.device_mesh import DeviceMesh

    if getattr(DeviceMesh.__getstate__, "_drops_hash", False):
        return
    getstate = DeviceMesh.__getstate__

    def without_hash(self: DeviceMesh) -> dict:
        state = getstate(self)
        state.pop("_hash", None)
        return state

    without_hash._drops_hash = True  # type: ignore[attr-defined]
    DeviceMesh.__getstate__ = without_hash  # type: ignore[method-assign]
