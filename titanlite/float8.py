"""The [float8] config section -> parallelisms' Float8Options, and the checks that need the
machine (torchao installed, GPU generation, backend). The conversion itself lives in
parallelisms/float8.py."""

from __future__ import annotations

from importlib.util import find_spec

from parallelisms.float8 import Float8Options, check_float8
from titanlite.config_schema import JobConfig


def float8_enabled(job: JobConfig) -> bool:
    return "float8" in job.model.converters


def float8_options(job: JobConfig, *, fsdp_enabled: bool, device_type: str) -> Float8Options | None:
    if not float8_enabled(job):
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
        force_recompute_weight_in_bwd=f.force_recompute_fp8_weight_in_bwd,
        float8_collectives=device_type == "cuda",
    )


def torchao_missing(job: JobConfig) -> str | None:
    if float8_enabled(job) and find_spec("torchao") is None:
        return "model.converters = ['float8'] needs torchao: pip install 'titanlite[float8]'"
    return None


def check(job: JobConfig, *, fsdp_enabled: bool, device_type: str, planning: bool) -> None:
    """Raise LayoutError for a float8 setup this machine cannot run. A dry run (`planning`)
    targets another machine, so the local GPU's generation is not checked."""
    opts = float8_options(job, fsdp_enabled=fsdp_enabled, device_type=device_type)
    if opts is None:
        return
    capability = None
    if device_type == "cuda" and not planning:
        import torch

        capability = torch.cuda.get_device_capability()
    check_float8(
        opts, fsdp_enabled=fsdp_enabled, device_type=device_type, cuda_capability=capability
    )
