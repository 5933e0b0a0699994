"""The job config's sections as the options parallelisms take (parallelisms never see the job
config): `ParallelizeOptions` (with its float8 part) and `PipelineOptions`."""

from __future__ import annotations

from parallelisms import ParallelDims, ParallelizeOptions
from parallelisms.float8 import Float8Options
from parallelisms.options import PipelineOptions
from titanlite.config.schema import JobConfig
from titanlite.core.dtypes import DTYPES


def float8_options(job: JobConfig, *, fsdp_enabled: bool, device_type: str) -> Float8Options | None:
    """The [float8] section as parallelisms' options; None when float8 is off."""
    if "float8" not in job.model.converters:
        return None
    f = job.float8
    # Like TorchTitan: without FSDP there is no weight all-gather to do in float8.
    all_gather = f.enable_fsdp_float8_all_gather and fsdp_enabled
    return Float8Options(
        recipe=f.recipe_name,
        emulate=f.emulate,
        filter_fqns=tuple(f.filter_fqns),
        fsdp_float8_all_gather=all_gather,
        precompute_scale=all_gather and f.precompute_float8_dynamic_scale_for_fsdp,
        float8_collectives=device_type == "cuda",
    )


def parallelize_options(job: JobConfig, dims: ParallelDims, device_type: str) -> ParallelizeOptions:
    t, p, ac = job.training, job.parallelism, job.activation_checkpoint
    return ParallelizeOptions(
        loss_parallel=dims.tp_enabled and not p.disable_loss_parallel,
        async_tp=p.enable_async_tensor_parallel,
        ac_mode=ac.mode,
        ac_option=ac.selective_ac_option,
        ac_memory_budget=ac.memory_budget,
        compile=t.compile,
        param_dtype=DTYPES[t.mixed_precision_param],
        reduce_dtype=DTYPES[t.mixed_precision_reduce],
        reshard_after_forward=p.fsdp_reshard_after_forward,
        cpu_offload=t.enable_cpu_offload,
        float8=float8_options(job, fsdp_enabled=dims.fsdp_enabled, device_type=device_type),
    )


def pipeline_options(job: JobConfig) -> PipelineOptions:
    p = job.parallelism
    return PipelineOptions(
        schedule=p.pipeline_parallel_schedule,
        schedule_csv=p.pipeline_parallel_schedule_csv,
        microbatch_size=p.pipeline_parallel_microbatch_size,
        layers_per_stage=p.pipeline_parallel_layers_per_stage,
        first_stage_less_layers=p.pipeline_parallel_first_stage_less_layers,
        last_stage_less_layers=p.pipeline_parallel_last_stage_less_layers,
    )
