"""The float8 checks that need the machine (torchao installed, GPU generation, backend). The
[float8] section becomes parallelisms' Float8Options in titanlite/build/assemble.py; the conversion
itself lives in parallelisms/float8.py."""

from __future__ import annotations

from importlib.util import find_spec

from titanlite.config.schema import JobConfig


def float8_enabled(job: JobConfig) -> bool:
    return "float8" in job.model.converters


def torchao_missing(job: JobConfig) -> str | None:
    if float8_enabled(job) and find_spec("torchao") is None:
        return "model.converters = ['float8'] needs torchao: pip install 'titanlite[float8]'"
    return None


def eager_warning(job: JobConfig) -> str:
    """The one warning line for float8 without training.compile, else "". Eagerly, each cast to
    float8 (amax, scale, cast, for the input, the weight and in backward the gradient) is its
    own kernel reading and writing the whole tensor, which usually costs more than the float8
    matmul saves over bfloat16; compile fuses the casts. `emulate` is for numerics, not speed."""
    if not float8_enabled(job) or job.training.compile or job.float8.emulate:
        return ""
    return (
        "titanlite: warning: model.converters = ['float8'] without training.compile: eager "
        "float8 casts are separate kernels and usually make the run slower than bfloat16; add "
        "--training.compile true"
    )


def check(job: JobConfig, *, fsdp_enabled: bool, device_type: str, planning: bool) -> None:
    """Raise LayoutError for a float8 setup this machine cannot run. A dry run (`planning`)
    targets another machine, so the local GPU's generation is not checked."""
    from parallelisms.float8 import check_float8
    from titanlite.build.options import float8_options

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
