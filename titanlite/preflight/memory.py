"""Memory a layout costs that a user may not expect, said in one warning line before the run
(preflight) and in the dry run's plan.

With `parallelism.fsdp_sync_grads_each_microbatch = false`, FSDP2 skips the reduce-scatter on
every micro-batch but the last (`set_requires_gradient_sync(False)`). torch 2.13's
FSDPParamGroup.post_backward then keeps each parameter's unsharded gradient, cast to the reduce
dtype (FSDPParam.to_accumulated_grad_if_needed; later micro-batches add into it), and reshards
only the parameters: every unit's gradients, all at once, unsharded (a tensor-parallel shard
stays a shard), until the last micro-batch's backward reduce-scatters them. For Llama 3 8B in
float32 that is 30 GiB on every GPU, whatever the data-parallel degree."""

from __future__ import annotations

from typing import Any

from titanlite.config.schema import JobConfig

GIB = 2**30


def keeps_unsharded_grads(job: JobConfig, dims: Any, grad_accum_steps: int) -> bool:
    """The trainer's condition (titanlite/trainer/trainer.py): FSDP on, no pipeline parallel
    (its schedule drives the syncs itself), several micro-batches, sync on the last only.
    `dims`: the layout's ParallelDims."""
    return (
        dims.fsdp_enabled
        and not dims.pp_enabled
        and grad_accum_steps > 1
        and not job.parallelism.fsdp_sync_grads_each_microbatch
    )


def unsharded_grad_bytes(job: JobConfig, tp: int, model_args: Any) -> int:
    """Their bytes per rank, from the parameter count (the dry run reads them off FSDP's own
    records instead; tensor-parallel-replicated norms make that a few KiB more)."""
    from titanlite.core.dtypes import DTYPES
    from titanlite.families import family_of_args

    n = family_of_args(model_args).model.num_params(model_args)
    return n // tp * DTYPES[job.training.mixed_precision_reduce].itemsize


def warning_line(job: JobConfig, grad_accum_steps: int, nbytes: int) -> str:
    return (
        f"titanlite: warning: parallelism.fsdp_sync_grads_each_microbatch = false with "
        f"{grad_accum_steps} micro-batches keeps every parameter's unsharded "
        f"{job.training.mixed_precision_reduce} gradient between them: {nbytes / GIB:.2f} GiB "
        "more per rank; --parallelism.fsdp_sync_grads_each_microbatch true (a reduce-scatter "
        "per micro-batch) avoids it"
    )


def unsharded_grads_warning(
    job: JobConfig, dims: Any, grad_accum_steps: int, model_args: Any
) -> str:
    """Preflight's one warning line, with the figure from the parameter count, else ""."""
    if not keeps_unsharded_grads(job, dims, grad_accum_steps):
        return ""
    return warning_line(job, grad_accum_steps, unsharded_grad_bytes(job, dims.tp, model_args))
