"""Everything that can be checked before a process group, model or data exists: versions,
config, model shape, parallel layout, tokenizer and dataset paths.

`python -m titanlite.preflight --config ... [overrides]` runs the checks in one process (what
run_train.sh does before torchrun) and exits 2 with one line on the first problem.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from titanlite.config.loader import ConfigError, load
from titanlite.config.schema import JobConfig
from titanlite.core.errors import EnvironmentProblem, report

if TYPE_CHECKING:  # the checks import torch lazily: `--help`-speed config errors
    from models import ModelArgs
    from parallelisms import ParallelDims
    from titanlite.data import DataSource

MIN_TORCH = (2, 7)


@dataclass(frozen=True)
class Preflight:
    """What the checks resolved, so the trainer does not resolve it again."""

    dims: ParallelDims
    model_args: ModelArgs
    tokenizer_path: Path
    dataset: DataSource | None  # text files or prepared shards; None in a dry run
    validation_dataset: DataSource | None  # the same for [validation]; None when it is off
    grad_accum_steps: int


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
    if job.metrics.enable_wandb and importlib.util.find_spec("wandb") is None:
        raise EnvironmentProblem(
            "metrics.enable_wandb needs wandb: pip install 'titanlite[wandb]' (or set "
            "--metrics.enable_wandb false)"
        )


def check(
    job: JobConfig, world_size: int, device: str | None = None, vocab_size: int | None = None
) -> Preflight:
    """Raise ConfigError (or a subclass of ValueError / EnvironmentProblem) on the first problem.

    A dry run plans for a cluster from a laptop: `device` overrides the local device type, and a
    given `vocab_size` stands in for the tokenizer; then the tokenizer and dataset paths, which
    live on the cluster, are not checked."""
    check_environment(job)
    from parallelisms import LayoutError, ParallelDims, check_layout
    from parallelisms.context_parallel import check_context_parallel
    from titanlite.core.distributed import device_type
    from titanlite.data import Tokenizer, open_dataset, resolve_dataset_path, resolve_tokenizer_path
    from titanlite.families import get_family, model_args
    from titanlite.preflight import float8

    spec = get_family(job.model.name).model
    if job.model.flavor not in spec.flavors:
        raise ConfigError(
            f"[model] flavor = {job.model.flavor!r}: unknown for {job.model.name}; "
            f"expected one of {', '.join(spec.flavors)}"
        )
    planning = vocab_size is not None
    bos_id = -1
    if vocab_size is None:
        tokenizer_path = resolve_tokenizer_path(job.model.tokenizer_path)
        tokenizer = Tokenizer(tokenizer_path)
        vocab_size, bos_id = tokenizer.vocab_size, tokenizer.bos_id
    else:  # a dry run planning for files that live on the cluster
        tokenizer_path = Path(job.model.tokenizer_path)
    check_seq_len(job)
    args = model_args(job, vocab_size, bos_id)
    try:
        args.check()
    except ValueError as e:
        raise ConfigError(f"[model] {e}") from None

    p, t = job.parallelism, job.training
    dims = ParallelDims.resolve(
        p.data_parallel_replicate_degree,
        p.data_parallel_shard_degree,
        p.tensor_parallel_degree,
        world_size,
        p.pipeline_parallel_degree,
        p.context_parallel_degree,
    )
    seq_lens = {"training.seq_len": t.seq_len}
    if job.validation.enabled and job.validation.seq_len:
        seq_lens["validation.seq_len"] = job.validation.seq_len
    check_context_parallel(
        dims.cp,
        dims.tp,
        seq_lens,
        p.context_parallel_load_balancer,
        p.context_parallel_rotate_method,
        job.model.attn_type,
    )
    if dims.pp_enabled:
        check_pipeline_job(job, dims, args.n_layers)
    check_layout(
        dims,
        n_heads=args.n_heads,
        n_kv_heads=args.kv_heads,
        seq_len=t.seq_len,
        local_batch_size=t.local_batch_size,
        global_batch_size=t.global_batch_size,
        device_type=device or device_type(),
        async_tp=p.enable_async_tensor_parallel,
        compile=t.compile,
    )
    if (v_seq := job.validation.enabled and job.validation.seq_len) and v_seq % dims.tp:
        raise LayoutError(
            f"validation.seq_len = {v_seq} is not divisible by tensor_parallel_degree = "
            f"{dims.tp} (sequence parallel splits the sequence over the tp ranks)"
        )
    float8.check(
        job,
        fsdp_enabled=dims.fsdp_enabled,
        device_type=device or device_type(),
        planning=device is not None,
    )
    if job.model.attn_type == "flex" and (device or device_type()) == "cpu":
        raise ConfigError(
            "[model] attn_type = 'flex' cannot train on CPU (torch has no FlexAttention "
            "backward there); use attn_type = 'sdpa', which applies the same masks"
        )
    if job.profiling.enable_memory_snapshot and (device or device_type()) != "cuda":
        raise ConfigError(
            "[profiling] enable_memory_snapshot records the CUDA caching allocator and this "
            "machine has no CUDA device; turn it off (CPU memory shows as memory_gib in the metrics)"
        )
    if t.enable_cpu_offload and (device or device_type()) != "cuda":
        raise ConfigError(
            "[training] enable_cpu_offload moves GPU memory to the host and needs CUDA; "
            "turn it off on CPU"
        )
    if t.enable_cpu_offload and not dims.fsdp_enabled:
        raise ConfigError(
            "[training] enable_cpu_offload needs FSDP (data_parallel_shard_degree > 1); "
            "turn it off for this layout"
        )
    if job.checkpoint.create_seed_checkpoint and world_size != 1:
        raise ConfigError(
            "[checkpoint] create_seed_checkpoint runs in one process (NGPU=1); every layout can "
            "then start from it"
        )
    per_step = t.local_batch_size * dims.dp_size
    accum = 1 if t.global_batch_size == -1 else t.global_batch_size // per_step
    dataset = validation = None
    if not planning:  # text files are listed, prepared shards checked against the tokenizer
        dataset = open_dataset(resolve_dataset_path(t.dataset, t.dataset_path), tokenizer)
        if job.validation.enabled:
            assert job.validation.dataset_path is not None  # config.validate requires it
            validation = open_dataset(
                Path(job.validation.dataset_path), tokenizer, "validation.dataset_path"
            )
    if not planning:
        check_output_paths(job)
        check_first_window(dataset, tokenizer, t.seq_len, t.dataset_text_field, "training")
        if validation is not None:
            v = job.validation
            check_first_window(
                validation, tokenizer, v.seq_len or t.seq_len, t.dataset_text_field, "validation"
            )
        check_checkpoint(job, args)
    if job.profiling.enable_profiling and job.profiling.profile_freq < 2:
        raise ConfigError("[profiling] profile_freq must be >= 2 (one warm-up step, one traced)")
    return Preflight(dims, args, tokenizer_path, dataset, validation, accum)


def check_pipeline_job(job: JobConfig, dims, n_layers: int) -> None:
    from parallelisms.parallel_dims import LayoutError
    from parallelisms.pipeline import check_pipeline
    from titanlite.build.assemble import pipeline_options

    check_pipeline(dims.pp, n_layers, job.training.local_batch_size, pipeline_options(job))
    if dims.ddp_enabled:
        raise LayoutError(
            "pipeline parallel with pure replication (data_parallel_replicate_degree > 1, "
            "data_parallel_shard_degree = 1) is not supported; use data_parallel_shard_degree "
            "> 1 (FSDP or HSDP)"
        )
    v, t = job.validation, job.training
    if v.enabled and (v.seq_len or t.seq_len, v.local_batch_size or t.local_batch_size) != (
        t.seq_len,
        t.local_batch_size,
    ):
        # The stages exchange buffers shaped for the training micro-batches.
        raise ConfigError(
            "[validation] under pipeline parallel validates with the training shapes; leave "
            "validation.seq_len and validation.local_batch_size unset (or equal to training's)"
        )


def check_seq_len(job: JobConfig) -> None:
    """training.seq_len within what the flavor is made for: the RoPE table is sized from
    seq_len, so an absurd value would otherwise try to allocate it (64 GB at 1e9)."""
    from titanlite.families import get_family

    limit = get_family(job.model.name).model.flavors[job.model.flavor].max_seq_len
    if job.training.seq_len > limit:
        raise ConfigError(
            f"[training] seq_len = {job.training.seq_len} is beyond the model's max_seq_len of "
            f"{limit} ({job.model.name} {job.model.flavor}); use at most {limit}"
        )


def check_output_paths(job: JobConfig) -> None:
    """The dump and checkpoint folders can be created and written now, not at the first save
    hours into the run."""
    dump = Path(job.job.dump_folder)
    folders = [("job.dump_folder", dump)]
    if job.checkpoint.enable_checkpoint or job.checkpoint.create_seed_checkpoint:
        folders.append(("checkpoint.folder", dump / job.checkpoint.folder))
    for key, folder in folders:
        if folder.exists() and not folder.is_dir():
            raise ConfigError(f"{key}: {folder} is an existing file, not a folder")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            probe = folder / f".titanlite-write-test-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise ConfigError(
                f"{key}: cannot write to {folder} ({e.strerror or e}); choose a writable folder"
            ) from None


def check_first_window(source, tokenizer, seq_len: int, text_field: str, what: str) -> None:
    """The data holds at least one window of seq_len + 1 tokens. Prepared shards say so in their
    manifest; text is read and tokenized from the start only until one window is full (a normal
    corpus costs a few documents; one whose every record is malformed is read to the end)."""
    from titanlite.data import DatasetError, ShardSet
    from titanlite.data.documents import SkippedRecords, iter_documents

    need = seq_len + 1
    if isinstance(source, ShardSet):
        if source.num_windows(seq_len) == 0:
            raise DatasetError(
                f"{source.key}: {source.manifest_file} holds {source.total_tokens} tokens, fewer "
                f"than one window of {what} seq_len + 1 = {need}; prepare more data"
            )
        return
    skipped, tokens, docs, batch = SkippedRecords(), 0, 0, []
    for _, _, text in iter_documents(source, text_field, 0, 0, skipped):
        docs += 1
        batch.append(text)
        if sum(map(len, batch)) >= need or len(batch) >= 64:
            tokens += sum(map(len, tokenizer.encode_documents(batch)))
            batch = []
            if tokens >= need:
                return
    tokens += sum(map(len, tokenizer.encode_documents(batch))) if batch else 0
    if tokens >= need:
        return
    where = f"{what} data ({len(source)} file(s), first {source[0]})"
    if docs == 0:
        example = f", e.g. {skipped.examples[0]}" if skipped.examples else ""
        raise DatasetError(
            f"{where}: no readable document; {skipped.count} malformed record(s){example}"
        )
    raise DatasetError(
        f"{where}: holds {tokens} tokens, fewer than one window of seq_len + 1 = {need}; "
        "add data or lower the seq_len"
    )


def checkpoint_to_load(job: JobConfig) -> Path | None:
    """The checkpoint the trainer will load, by the rules of CheckpointManager.load; None for a
    fresh start. CheckpointError when checkpoint.load_step names no complete checkpoint."""
    from titanlite.components.checkpoint.storage import CheckpointError, complete_steps, step_dir

    c = job.checkpoint
    if not (c.enable_checkpoint or c.create_seed_checkpoint):
        return None
    folder = Path(job.job.dump_folder) / c.folder
    steps = complete_steps(folder)
    if c.load_step >= 0:
        if c.load_step not in steps:
            raise CheckpointError(
                f"checkpoint.load_step = {c.load_step}: {step_dir(folder, c.load_step)} "
                f"is not a complete checkpoint (complete: {steps or 'none'})"
            )
        return step_dir(folder, c.load_step)
    if steps:
        return step_dir(folder, steps[-1])
    return Path(c.initial_load_path) if c.initial_load_path else None


def check_checkpoint(job: JobConfig, args) -> None:
    """The checkpoint to load: its files all there at the manifest's sizes (the CRC pass, which
    reads every byte, stays with the ranks), its `.metadata` readable by the restricted
    unpickler, and its model tensors the configured model's shapes."""
    import torch
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from titanlite.components.checkpoint.storage import (
        CheckpointError,
        read_manifest,
        read_metadata,
        verify,
    )
    from titanlite.families import get_family

    check_hf_options(job)
    path = checkpoint_to_load(job)
    if path is None:
        return
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


def user_errors() -> tuple[type[Exception], ...]:
    """Exceptions that mean "the user asked for something impossible", not a bug."""
    from parallelisms import LayoutError
    from titanlite.components.checkpoint.storage import CheckpointError
    from titanlite.data import DatasetError, TokenizerError

    return (
        ConfigError,
        LayoutError,
        DatasetError,
        TokenizerError,
        CheckpointError,
        EnvironmentProblem,
    )


def run(argv: list[str], world_size: int) -> tuple[JobConfig, Preflight]:
    job = load(argv)
    return job, check(job, world_size)


def launched_world_size() -> int:
    """WORLD_SIZE as run_train.sh sets it from NGPU (x nodes), checked: NGPU=abc or NGPU=0 is the
    user's mistake and must be named as such, not as a parallelism degree."""
    raw = os.environ.get("WORLD_SIZE", "1")
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ConfigError(
            f"NGPU={os.environ.get('NGPU', raw)}: expected a positive number of processes per node"
        )
    return n


def main(argv: list[str] | None = None) -> int:
    try:
        run(sys.argv[1:] if argv is None else argv, launched_world_size())
    except user_errors() as e:
        return report(e)
    return 0
