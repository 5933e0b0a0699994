"""titanlite: a modular, PyTorch-native stack for pretraining Llama-style models."""

from __future__ import annotations

__version__ = "0.1.0"


def plan(config, world_size: int, **kwargs):
    """Dry-run planning from Python: `titanlite.plan(job_config, 256) -> Plan` (see
    titanlite.planning.dry_run.plan for the options)."""
    from titanlite.planning.dry_run import plan as _plan

    return _plan(config, world_size, **kwargs)


__all__ = ["plan", "__version__"]
