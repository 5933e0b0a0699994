"""Everything that can be checked before a process group, model or data exists: versions,
config, model shape, parallel layout, tokenizer and dataset paths.

`python -m titanlite.preflight --config ... [overrides]` runs the checks in one process (what
run_train.sh does before torchrun) and exits 2 with one line on the first problem.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from titanlite.config import ConfigError, load
from titanlite.config_schema import JobConfig

MIN_TORCH = (2, 7)


class EnvironmentProblem(RuntimeError):
    pass


@dataclass(frozen=True)
class Preflight:
    """What the checks resolved, so the trainer does not resolve it again."""

    dims: object  # parallelisms.ParallelDims
    model_args: object
    tokenizer_path: Path
    dataset: object  # data.DataSource: text files or prepared shards; None in a dry run
    validation_dataset: object  # the same for [validation], None when it is off
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
    from titanlite.float8 import torchao_missing

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


def model_args(job: JobConfig, vocab_size: int):
    """The model's hyper-parameters: the flavor with the [model] overrides, the tokenizer's
    vocabulary and the training sequence length (the RoPE table's size)."""
    from models import MODELS

    m = job.model
    return (
        MODELS[m.name]
        .flavors[m.flavor]
        .with_overrides(
            vocab_size=vocab_size,
            max_seq_len=job.training.seq_len,
            dim=m.dim,
            n_layers=m.n_layers,
            n_heads=m.n_heads,
            n_kv_heads=m.n_kv_heads,
            multiple_of=m.multiple_of,
            ffn_dim_multiplier=m.ffn_dim_multiplier,
            norm_eps=m.norm_eps,
            rope_theta=m.rope_theta,
        )
    )


def check(
    job: JobConfig, world_size: int, device: str | None = None, vocab_size: int | None = None
) -> Preflight:
    """Raise ConfigError (or a subclass of ValueError / EnvironmentProblem) on the first problem.

    A dry run plans for a cluster from a laptop: `device` overrides the local device type, and a
    given `vocab_size` stands in for the tokenizer; then the tokenizer and dataset paths, which
    live on the cluster, are not checked."""
    check_environment(job)
    from models import MODELS
    from parallelisms import LayoutError, ParallelDims, check_layout
    from titanlite import float8
    from titanlite.data import Tokenizer, open_dataset, resolve_dataset_path, resolve_tokenizer_path
    from titanlite.distributed import device_type

    spec = MODELS[job.model.name]
    if job.model.flavor not in spec.flavors:
        raise ConfigError(
            f"[model] flavor = {job.model.flavor!r}: unknown for {job.model.name}; "
            f"expected one of {', '.join(spec.flavors)}"
        )
    planning = vocab_size is not None
    if not planning:
        tokenizer_path = resolve_tokenizer_path(job.model.tokenizer_path)
        tokenizer = Tokenizer(tokenizer_path)
        vocab_size = tokenizer.vocab_size
    else:  # a dry run planning for files that live on the cluster
        tokenizer_path = Path(job.model.tokenizer_path)
    args = model_args(job, vocab_size)
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
    )
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
            validation = open_dataset(
                Path(job.validation.dataset_path), tokenizer, "validation.dataset_path"
            )
    if job.profiling.enable_profiling and job.profiling.profile_freq < 2:
        raise ConfigError("[profiling] profile_freq must be >= 2 (one warm-up step, one traced)")
    return Preflight(dims, args, tokenizer_path, dataset, validation, accum)


def user_errors() -> tuple[type[Exception], ...]:
    """Exceptions that mean "the user asked for something impossible", not a bug."""
    from parallelisms import LayoutError
    from titanlite.checkpoint_storage import CheckpointError
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


def main(argv: list[str] | None = None) -> int:
    try:
        run(sys.argv[1:] if argv is None else argv, int(os.environ.get("WORLD_SIZE", "1")))
    except user_errors() as e:
        print(f"titanlite: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
