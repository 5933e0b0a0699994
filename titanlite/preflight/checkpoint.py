"""The checkpoint a run will load, checked before the ranks start: the Hugging Face options, the
files against the manifest, and the model's keys and shapes."""

from __future__ import annotations

from pathlib import Path

from titanlite.config.loader import ConfigError
from titanlite.config.schema import JobConfig


def checkpoint_to_load(job: JobConfig) -> Path | None:
    """The checkpoint the trainer will load (the rule of components/checkpoint/resume.py, which
    CheckpointManager.load follows); None for a fresh start. CheckpointError when
    checkpoint.load_step names no complete checkpoint."""
    from titanlite.components.checkpoint.resume import resume_point

    point = resume_point(job.checkpoint, Path(job.job.dump_folder) / job.checkpoint.folder)
    return None if point is None else point.path


def check_checkpoint(job: JobConfig, args) -> None:
    """The checkpoint to load: its files all there at the manifest's sizes (the CRC pass, which
    reads every byte, stays with the ranks), its `.metadata` readable by the restricted
    unpickler, and its model tensors the configured model's shapes."""
    check_hf_options(job)
    path = checkpoint_to_load(job)
    if path is None:
        return
    # Imported only when there is a checkpoint to read: DCP costs a fresh start ~1 s.
    import torch
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from titanlite.components.checkpoint.folder import CheckpointError
    from titanlite.components.checkpoint.storage import read_manifest, read_metadata, verify
    from titanlite.families import get_family

    if job.checkpoint.initial_load_in_hf and path == Path(job.checkpoint.initial_load_path or ""):
        from titanlite.components.checkpoint.hf import HFFolder

        HFFolder(path, args)  # its config and every tensor's shape against the configured model
        return
    problems = verify(path, checksums=False)
    if problems:
        raise CheckpointError(f"cannot load {path}: " + "; ".join(problems[:3]))
    keys = read_manifest(path).get("keys", ["model"])
    if "model" not in keys or "model" in job.checkpoint.exclude_from_loading:
        return
    saved = read_metadata(path).state_dict_metadata
    with torch.device("meta"):
        model = get_family(job.model.name).model.model_cls(args)
    for key, value in model.state_dict().items():
        meta = saved.get(f"model.{key}")
        if not isinstance(meta, TensorStorageMetadata):
            raise CheckpointError(
                f"checkpoint {path} has no model key '{key}': it holds another model "
                f"than the configured {job.model.name} {job.model.flavor}"
            )
        if tuple(meta.size) != tuple(value.shape):
            raise CheckpointError(
                f"checkpoint {path}: model key '{key}' has shape {tuple(meta.size)}, the model "
                f"(as configured: {job.model.name} {job.model.flavor}) has "
                f"{tuple(value.shape)}; point checkpoint.folder elsewhere or configure that model"
            )


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
