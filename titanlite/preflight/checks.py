"""Everything that can be checked before a process group, model or data exists: versions,
config, model shape, parallel layout, tokenizer and dataset paths.

`python -m titanlite.preflight --config ... [overrides]` runs the checks in one process (what
run_train.sh does before torchrun) and exits 2 with one line on the first problem.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from titanlite.config.loader import ConfigError, load
from titanlite.config.schema import WORLD_MAX, JobConfig
from titanlite.core import dump_lock
from titanlite.core.errors import EnvironmentProblem, report
from titanlite.core.numbers import NumberError, read_int
from titanlite.preflight.checkpoint import check_checkpoint, check_seed_checkpoint
from titanlite.preflight.data import check_windows, open_datasets
from titanlite.preflight.environment import check_environment
from titanlite.preflight.evals import EvalTask, check_eval_tasks
from titanlite.preflight.float8 import eager_warning
from titanlite.preflight.memory import unsharded_grads_warning

if TYPE_CHECKING:  # the checks import torch lazily: `--help`-speed config errors
    from models import ModelArgs
    from parallelisms import ParallelDims
    from titanlite.data import DataSource, Mixture, Tokenizer


@dataclass(frozen=True)
class Preflight:
    """What the checks resolved, so the trainer does not resolve it again."""

    dims: ParallelDims
    model_args: ModelArgs
    tokenizer_path: Path
    dataset: DataSource | Mixture | None  # text, prepared shards, a mixture; None in a dry run
    # The held-out sets by name ("": validation.dataset_path); empty when validation is off.
    validation_datasets: dict[str, DataSource]
    grad_accum_steps: int
    # The [eval] tasks by name with their tokenized requests; empty when eval is off.
    eval_tasks: dict[str, EvalTask] = field(default_factory=dict)


def check(
    job: JobConfig, world_size: int, device: str | None = None, vocab_size: int | None = None
) -> Preflight:
    """Raise ConfigError (or a subclass of ValueError / EnvironmentProblem) on the first problem.

    A dry run plans for a cluster from a laptop: `device` overrides the local device type, and a
    given `vocab_size` stands in for the tokenizer; then the tokenizer and dataset paths, which
    live on the cluster, are not checked."""
    check_environment(job)
    from titanlite.core.distributed import device_type

    target = device or device_type()
    tokenizer_path, tokenizer, args = check_model(job, vocab_size)
    dims = check_parallelism(job, world_size, args, target)
    check_devices(job, dims, target, planning=device is not None)
    check_seed_checkpoint(job, world_size)
    dataset, validation, evals = None, {}, {}
    if tokenizer is not None:  # not a dry run: the files are here to check
        evals = check_eval_tasks(job, tokenizer)
        dataset, validation = open_datasets(job, tokenizer)
        check_output_paths(job)
        accum = grad_accum_steps(job, dims.dp_size)
        global_batch = job.training.local_batch_size * dims.dp_size * accum
        # A dry run prints a mixture's overrun in its plan, then refuses it (mixture_plan).
        check_windows(job, dataset, validation, tokenizer, global_batch, finite=device is None)
        check_checkpoint(job, args)
    check_profiling(job)
    return Preflight(
        dims, args, tokenizer_path, dataset, validation, grad_accum_steps(job, dims.dp_size), evals
    )


def check_model(job: JobConfig, vocab_size: int | None) -> tuple[Path, Tokenizer | None, ModelArgs]:
    """The flavor, the tokenizer (None when a dry run's `vocab_size` stands in for it), the
    sequence length and the model's arguments."""
    from titanlite.data import Tokenizer, resolve_tokenizer_path
    from titanlite.families import foreign_model_keys, get_family, model_args

    spec = get_family(job.model.name).model
    if job.model.flavor not in spec.flavors:
        raise ConfigError(
            f"[model] flavor = {job.model.flavor!r}: unknown for {job.model.name}; "
            f"expected one of {', '.join(spec.flavors)}"
        )
    for key in foreign_model_keys(job):
        raise ConfigError(
            f"[model] {key} = {getattr(job.model, key)!r} is no hyper-parameter of "
            f"{job.model.name} models (it would be ignored); remove it"
        )
    tokenizer, bos_id = None, -1
    if vocab_size is None:
        tokenizer_path = resolve_tokenizer_path(job.model.tokenizer_path)
        tokenizer = Tokenizer(tokenizer_path)
        vocab_size, bos_id = tokenizer.vocab_size, tokenizer.bos_id
    else:  # a dry run planning for files that live on the cluster
        tokenizer_path = Path(job.model.tokenizer_path)
    check_seq_len(job)
    args = model_args(job, vocab_size, bos_id)
    if tokenizer is not None and args.vocab_size < vocab_size:  # the flavor fixed a smaller one
        raise ConfigError(
            f"[model] tokenizer_path = {str(tokenizer_path)!r} has {vocab_size} tokens, more than "
            f"the {args.vocab_size} embedding rows of {job.model.name} {job.model.flavor}: use "
            "the tokenizer published with the model"
        )
    try:
        args.check()
    except ValueError as e:
        raise ConfigError(f"[model] {e}") from None
    return tokenizer_path, tokenizer, args


def check_parallelism(
    job: JobConfig, world_size: int, args: ModelArgs, device_type: str
) -> ParallelDims:
    """The parallel degrees resolved for `world_size`, and the layout they make (context and
    pipeline parallel included) checked against the model and the batch."""
    from parallelisms import LayoutError, ParallelDims, check_layout
    from parallelisms.context_parallel import check_context_parallel

    p, t = job.parallelism, job.training
    dims = ParallelDims.resolve(
        p.data_parallel_replicate_degree,
        p.data_parallel_shard_degree,
        p.tensor_parallel_degree,
        world_size,
        p.pipeline_parallel_degree,
        p.context_parallel_degree,
        p.expert_parallel_degree,
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
        if getattr(args, "tie_word_embeddings", False):
            raise LayoutError(
                f"model.flavor = {job.model.flavor!r} ties its output head to the embedding, "
                "which pipeline parallel cannot put on the first and the last stage at once; "
                "use pipeline_parallel_degree = 1 or an untied flavor"
            )
    check_layout(
        dims,
        n_heads=args.n_heads,
        n_kv_heads=args.kv_heads,
        seq_len=t.seq_len,
        local_batch_size=t.local_batch_size,
        global_batch_size=t.global_batch_size,
        device_type=device_type,
        async_tp=p.enable_async_tensor_parallel,
        compile=t.compile,
        num_experts=moe.num_experts if (moe := getattr(args, "moe", None)) else 0,
    )
    family_limits = getattr(args, "check_parallelism", None)  # what a family cannot run
    if family_limits is not None:
        try:
            family_limits(pp=dims.pp, cp=dims.cp)
        except ValueError as e:
            raise LayoutError(str(e)) from None
    if (v_seq := job.validation.enabled and job.validation.seq_len) and v_seq % dims.tp:
        raise LayoutError(
            f"validation.seq_len = {v_seq} is not divisible by tensor_parallel_degree = "
            f"{dims.tp} (sequence parallel splits the sequence over the tp ranks)"
        )
    return dims


def check_devices(job: JobConfig, dims: ParallelDims, device_type: str, planning: bool) -> None:
    """What the device type can run: float8, FlexAttention's backward, the CUDA memory
    snapshot, CPU offload. A dry run (`planning`) does not check the local GPU's generation."""
    from titanlite.preflight import float8

    float8.check(job, fsdp_enabled=dims.fsdp_enabled, device_type=device_type, planning=planning)
    t = job.training
    if t.mixed_precision_param == "float16":
        # float16's 5 exponent bits underflow small gradients to zero without a loss scale, and
        # titanlite has no (FSDP-sharded) gradient scaler: training would go on, quietly wrong.
        raise ConfigError(
            "[training] mixed_precision_param = 'float16' needs a gradient scaler, which "
            "titanlite does not have (small gradients would underflow to zero); use 'bfloat16' "
            "(the same memory, float32's range) or 'float32'"
        )
    if job.model.attn_type == "flex" and device_type == "cpu":
        raise ConfigError(
            "[model] attn_type = 'flex' cannot train on CPU (torch has no FlexAttention "
            "backward there); use attn_type = 'auto', which applies the same masks"
        )
    if (
        job.model.attn_type == "varlen"
        and device_type == "cuda"
        and t.mixed_precision_param not in ("bfloat16", "float16")
    ):
        raise ConfigError(
            "[model] attn_type = 'varlen' runs flash attention on CUDA, which takes bfloat16 "
            f"or float16, and training.mixed_precision_param is {t.mixed_precision_param!r}: "
            "set it to 'bfloat16', or use attn_type = 'auto' (FlexAttention in float32)"
        )
    if job.profiling.enable_memory_snapshot and device_type != "cuda":
        raise ConfigError(
            "[profiling] enable_memory_snapshot records the CUDA caching allocator and this "
            "machine has no CUDA device; turn it off (CPU memory shows as memory_gib in the metrics)"
        )
    if t.enable_cpu_offload and device_type != "cuda":
        raise ConfigError(
            "[training] enable_cpu_offload moves GPU memory to the host and needs CUDA; "
            "turn it off on CPU"
        )
    if t.enable_cpu_offload and not dims.fsdp_enabled:
        raise ConfigError(
            "[training] enable_cpu_offload needs FSDP (data_parallel_shard_degree > 1); "
            "turn it off for this layout"
        )


def grad_accum_steps(job: JobConfig, dp_size: int) -> int:
    t = job.training
    return 1 if t.global_batch_size == -1 else t.global_batch_size // (t.local_batch_size * dp_size)


def check_profiling(job: JobConfig) -> None:
    if job.profiling.enable_profiling and job.profiling.profile_freq < 2:
        raise ConfigError("[profiling] profile_freq must be >= 2 (one warm-up step, one traced)")


def check_pipeline_job(job: JobConfig, dims, n_layers: int) -> None:
    from parallelisms.parallel_dims import LayoutError
    from parallelisms.pipeline import check_pipeline
    from titanlite.build.options import pipeline_options

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
    # Another live run in this folder refuses this one here, before torchrun; the ranks of a
    # run whose launcher holds the lock (and ranks other than 0) do not look.
    if os.environ.get("RANK", "0") == "0" and not dump_lock.held_by_launcher(dump):
        dump_lock.probe(dump)


def user_errors() -> tuple[type[Exception], ...]:
    """Exceptions that mean "the user asked for something impossible", not a bug."""
    from parallelisms import LayoutError
    from titanlite.components.checkpoint.folder import CheckpointError
    from titanlite.data import DatasetError, TokenizerError
    from titanlite.evals import TaskError

    return (
        ConfigError,
        NumberError,
        LayoutError,
        DatasetError,
        TokenizerError,
        TaskError,
        CheckpointError,
        EnvironmentProblem,
        dump_lock.FolderInUse,
    )


def run(argv: list[str], world_size: int) -> tuple[JobConfig, Preflight]:
    job = load(argv)
    return job, check(job, world_size)


def launched_world_size() -> int:
    """WORLD_SIZE as run_train.sh sets it from NGPU (x nodes), checked: NGPU=abc or NGPU=0 is the
    user's mistake and must be named as such, not as a parallelism degree."""
    raw = os.environ.get("WORLD_SIZE", "1")
    try:
        return read_int(raw, "WORLD_SIZE", 1, WORLD_MAX)
    except NumberError:
        raise ConfigError(
            f"NGPU={os.environ.get('NGPU', raw)}: expected a positive number of processes per "
            f"node (a world size of at most {WORLD_MAX})"
        ) from None


def check_launcher_env(world_size: int) -> None:
    """run_train.sh's own variables, which torchrun would otherwise reject with a usage message
    about flags the user never typed (or, for a LOG_RANK beyond the ranks, show nothing)."""
    for name in ("MAX_RESTARTS", "STOP_GRACE_SECONDS"):
        raw = os.environ.get(name)
        if raw is not None and not (raw.strip().isdigit() and int(raw) <= 10**9):
            raise ConfigError(f"{name}={raw}: expected a whole number >= 0 (or leave it unset)")
    raw = os.environ.get("LOG_RANK")
    if raw is None:
        return
    if not all(r.strip().isdigit() and int(r) < world_size for r in raw.split(",")):
        raise ConfigError(
            f"LOG_RANK={raw}: expected local ranks within 0..{world_size - 1} (NGPU = "
            f"{world_size}), comma-separated, e.g. LOG_RANK=0 or LOG_RANK=0,1"
        )


def main(argv: list[str] | None = None) -> int:
    try:
        world_size = launched_world_size()
        check_launcher_env(world_size)
        job, pre = run(sys.argv[1:] if argv is None else argv, world_size)
    except user_errors() as e:
        return report(e)
    warn_emulated_bf16(job)
    for line in (
        eager_warning(job),
        unsharded_grads_warning(job, pre.dims, pre.grad_accum_steps, pre.model_args),
    ):
        if line:
            print(line, file=sys.stderr)
    return 0


def warn_emulated_bf16(job: JobConfig) -> None:
    """One line, from this launch step (not from every rank): bfloat16 emulated on this CPU."""
    from titanlite.core.distributed import device_type
    from titanlite.preflight import bf16

    if line := bf16.warning(job, device_type(), bf16.cpu_flags(), dict(os.environ)):
        print(line, file=sys.stderr)
