"""The checkpoint a run will load, checked before the ranks start: the Hugging Face options, the
files against the manifest, and the model's keys and shapes."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from titanlite.config.loader import ConfigError
from titanlite.config.schema import JobConfig

if TYPE_CHECKING:  # the checks import torch lazily: `--help`-speed config errors
    from titanlite.components.checkpoint.resume import ResumePoint


def checkpoint_to_load(job: JobConfig) -> ResumePoint | None:
    """The checkpoint the trainer will load (the rule of components/checkpoint/resume.py, which
    CheckpointManager.load follows); None for a fresh start. CheckpointError when
    checkpoint.load_step names no complete checkpoint."""
    from titanlite.components.checkpoint.resume import resume_point

    return resume_point(job.checkpoint, Path(job.job.dump_folder) / job.checkpoint.folder)


def check_checkpoint(job: JobConfig, args) -> None:
    """The checkpoint to load: its files all there at the manifest's sizes (the CRC pass, which
    reads every byte, stays with the ranks), its `.metadata` readable by the restricted
    unpickler, and its model tensors exactly the configured model's (model_tensor_problem)."""
    check_hf_options(job)
    point = checkpoint_to_load(job)
    if point is None:
        return
    path = point.path
    # Imported only when there is a checkpoint to read: DCP costs a fresh start ~1 s.
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from titanlite.components.checkpoint.folder import CheckpointError
    from titanlite.components.checkpoint.storage import read_manifest, read_metadata, verify

    if job.checkpoint.initial_load_in_hf and path == Path(job.checkpoint.initial_load_path or ""):
        from titanlite.components.checkpoint.hf import HFFolder

        HFFolder(path, args)  # its config, every tensor's shape and dtype: the configured model's
        return
    problems = verify(path, checksums=False)
    if problems:
        raise CheckpointError(f"cannot load {path}: " + "; ".join(problems[:3]))
    keys = read_manifest(path).get("keys", ["model"])
    excluded = job.checkpoint.exclude_from_loading
    where = "checkpoint" if point.step is None else f"checkpoint step {point.step}"
    metadata = read_metadata(path).state_dict_metadata
    if "optimizer" in keys and "optimizer" not in excluded:
        problem = optimizer_switch_problem(list(metadata), job, args)
        if problem:
            raise CheckpointError(f"{where} ({path}): {problem}")
    if "model" not in keys or "model" in excluded:
        return
    saved = {
        k[len("model.") :]: tuple(m.size)
        for k, m in metadata.items()
        if k.startswith("model.") and isinstance(m, TensorStorageMetadata)
    }
    recorded = (read_manifest(path).get("model_config") or {}).get("args") or {}
    problem = model_tensor_problem(saved, recorded, args, job)
    if problem:
        raise CheckpointError(f"{where} ({path}): {problem}")


# The state each optimizer keeps for a parameter (torch's Muon and Adam/AdamW names).
_STATE_OF = {"momentum_buffer": "Muon", "exp_avg": "AdamW"}


def optimizer_switch_problem(saved_keys: list[str], job: JobConfig, args) -> str | None:
    """Why the configured optimizer cannot continue the checkpoint's optimizer state: a
    parameter whose saved state is another optimizer's (AdamW's moments for a matrix Muon now
    steps, or the reverse, after a switch of optimizer.name or of optimizer.muon_exclude)."""
    import torch

    from titanlite.components.param_groups import trainable, uses_muon
    from titanlite.families import get_family

    saved: dict[str, str] = {}
    for key in saved_keys:
        name, _, state = key.removeprefix("optimizer.state.").rpartition(".")
        if key.startswith("optimizer.state.") and state in _STATE_OF:
            saved[name] = _STATE_OF[state]
    cfg = job.optimizer
    with torch.device("meta"):
        model = get_family(job.model.name).model.model_cls(args)
    for name, p, owner in trainable(model):
        muon = cfg.name == "Muon" and uses_muon(name, p, owner, cfg.muon_exclude)
        mine = "Muon" if muon else "AdamW"
        if saved.get(name, mine) != mine:
            return (
                f"'{name}' has {saved[name]} optimizer state, but optimizer.name = "
                f"{cfg.name!r} (muon_exclude {cfg.muon_exclude}) steps it with {mine}; resume "
                "with the checkpoint's optimizer settings, or start a fresh optimizer from "
                "its weights with --checkpoint.exclude_from_loading optimizer,lr_scheduler"
            )
    return None


def _tensor_shapes(job: JobConfig, args) -> dict[str, tuple[int, ...]]:
    import torch

    from titanlite.families import get_family

    with torch.device("meta"):
        model = get_family(job.model.name).model.model_cls(args)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def model_tensor_problem(
    saved: dict[str, tuple[int, ...]], recorded: dict, args, job: JobConfig
) -> str | None:
    """Why the configured model cannot take the checkpoint's model tensors (`saved`: key ->
    shape), None when it can. Every tensor of either side must be on the other at the same shape:
    a checkpoint holding tensors the configured model lacks (fewer blocks, no MoE) would load
    into a smaller model and silently train something else. Only
    checkpoint.allow_partial_model_load admits that one case, on purpose."""
    mine = _tensor_shapes(job, args)
    missing = [k for k in mine if k not in saved]
    reshaped = [k for k in mine if k in saved and saved[k] != mine[k]]
    extra = [k for k in saved if k not in mine]
    if not (missing or reshaped or extra):
        return None
    if not (missing or reshaped) and job.checkpoint.allow_partial_model_load:
        from titanlite.core.logging import logger

        logger.warning(
            f"checkpoint.allow_partial_model_load: loading {len(mine)} of the checkpoint's "
            f"{len(saved)} model tensors; {len(extra)} (e.g. '{extra[0]}') are left out"
        )
        return None
    fields = shape_changing_fields(recorded, args, job, mine)
    fix = (
        "configure the checkpoint's values, point checkpoint.folder elsewhere"
        + ("" if missing or reshaped else ", or set checkpoint.allow_partial_model_load = true")
        + " (docs/checkpoint.md)"
    )
    if fields:
        return f"saved with {'; '.join(fields)}, which changes the model's tensors; {fix}"
    if missing:
        return (
            f"has no model key '{missing[0]}': it holds another model than the configured "
            f"{job.model.name} {job.model.flavor}; {fix}"
        )
    if reshaped:
        k = reshaped[0]
        return (
            f"model key '{k}' has shape {saved[k]}, the model (as configured: {job.model.name} "
            f"{job.model.flavor}) has {mine[k]}; {fix}"
        )
    return (
        f"holds {len(extra)} model tensor(s) the configured {job.model.name} {job.model.flavor} "
        f"lacks (e.g. '{extra[0]}'); {fix}"
    )


def shape_changing_fields(
    recorded: dict, args, job: JobConfig, mine: dict[str, tuple[int, ...]]
) -> list[str]:
    """The recorded hyper-parameters that differ from the configured ones and, set alone to the
    checkpoint's value, change the configured model's tensors: the fields to name."""
    configured = args.to_dict()
    found = []
    for k, v in recorded.items():
        if k not in configured or configured[k] == v:
            continue
        try:
            other = type(args).from_dict({**configured, k: v})
            other.check()
        except (TypeError, ValueError):
            continue
        if _tensor_shapes(job, other) != mine:
            found.append(f"{k} = {v} (checkpoint) vs {configured[k]} (configured)")
    return found


def check_hf_options(job: JobConfig) -> None:
    c = job.checkpoint
    if not (c.initial_load_in_hf or c.last_save_in_hf):
        return
    from titanlite.families import get_family, hf_families

    if get_family(job.model.name).hf is None:
        mapped = ", ".join(f.name for f in hf_families()) or "no"
        raise ConfigError(
            f"[checkpoint] Hugging Face loading and export map {mapped} models only, not "
            f"{job.model.name}"
        )
    if c.initial_load_in_hf and not c.initial_load_path:
        raise ConfigError(
            "[checkpoint] initial_load_in_hf needs initial_load_path (the Hugging Face folder)"
        )
    if c.initial_load_in_hf and not c.initial_load_model_weights_only:
        raise ConfigError(
            "[checkpoint] initial_load_in_hf: a Hugging Face folder holds model weights only; "
            "set initial_load_model_weights_only"
        )
    for name in ("initial_load_in_hf", "last_save_in_hf"):
        if getattr(c, name) and not c.enable_checkpoint:
            raise ConfigError(f"[checkpoint] {name} needs enable_checkpoint")


def check_seed_checkpoint(job: JobConfig, world_size: int) -> None:
    if job.checkpoint.create_seed_checkpoint and world_size != 1:
        raise ConfigError(
            "[checkpoint] create_seed_checkpoint runs in one process (NGPU=1); every layout can "
            "then start from it"
        )
