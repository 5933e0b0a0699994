"""The packages a run needs, and their versions, checked before anything imports them."""

from __future__ import annotations

import importlib.util
import os

from titanlite.config.schema import JobConfig
from titanlite.core.errors import EnvironmentProblem

MIN_TORCH = (2, 7)
# What wandb.init accepts as WANDB_MODE (wandb's Settings), the documented three first.
WANDB_MODES = ("online", "offline", "disabled", "dryrun", "run", "shared")


def check_environment(job: JobConfig) -> None:
    try:
        import torch
    except ImportError:
        raise EnvironmentProblem("torch is not installed: pip install 'torch>=2.7'") from None
    version = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    if version < MIN_TORCH:
        raise EnvironmentProblem(
            f"torch {torch.__version__} is older than the minimum "
            f"{'.'.join(map(str, MIN_TORCH))}: pip install --upgrade 'torch>={MIN_TORCH[0]}.{MIN_TORCH[1]}'"
        )
    for module, package in (("torchdata", "torchdata"), ("tokenizers", "tokenizers")):
        try:
            __import__(module)
        except ImportError:
            raise EnvironmentProblem(f"{package} is not installed: pip install {package}") from None
    from titanlite.preflight.float8 import torchao_missing

    if (problem := torchao_missing(job)) is not None:
        raise EnvironmentProblem(problem)
    if job.metrics.enable_tensorboard:
        try:
            import tensorboard  # noqa: F401
        except ImportError:
            raise EnvironmentProblem(
                "metrics.enable_tensorboard needs tensorboard: pip install tensorboard "
                "(or set --metrics.enable_tensorboard false)"
            ) from None
    mode = os.environ.get("WANDB_MODE")
    if job.metrics.enable_wandb and mode is not None and mode not in WANDB_MODES:
        raise EnvironmentProblem(
            f"WANDB_MODE={mode}: wandb takes {', '.join(WANDB_MODES[:3])}; set one of them "
            "(or unset WANDB_MODE)"
        )
    if job.metrics.enable_wandb and importlib.util.find_spec("wandb") is None:
        raise EnvironmentProblem(
            "metrics.enable_wandb needs wandb: pip install 'titanlite[wandb]' (or set "
            "--metrics.enable_wandb false)"
        )
