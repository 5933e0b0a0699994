"""The job configuration: one typed dataclass per TOML section.

Section and key names follow TorchTitan's TOML-era schema wherever the concept is the same, so
that a TorchTitan Llama 3 TOML loads unchanged apart from file paths. Field metadata drives the
loader (`titanlite.config.loader`): `choices`, `min`, `max`, `sentinel` (a value outside
[min, max] with a meaning of its own, such as -1 = all), and `unsupported`, which names a value
beyond the default that titanlite does not implement yet (the loader refuses it with a clear
error rather than silently ignoring it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# What a checkpoint holds (components/checkpoint/states.py keeps these names): the keys that
# checkpoint.exclude_from_loading may name.
CHECKPOINT_KEYS = ("model", "optimizer", "lr_scheduler", "dataloader", "train_state", "rng")

# The ranges every integer field states (tests/unit/config/test_bounds.py checks that each has a
# min and a max): far past any real run, well inside what the code that reads the value takes,
# so that 10**30 is one line at load time, not an overflow in a C long deep in a step.
STEPS_MAX = 10**9  # optimizer steps and step counts: 30 years at one step per second
WIDTH_MAX = 2**20  # hidden sizes, heads, layers, sequences per batch (2026's largest dim: 32K)
GLOBAL_BATCH_MAX = 2**31 - 1  # sequences per optimizer step (17T tokens at 8K per sequence)
SEQ_MAX = 2**24  # tokens per sequence: 16M (context-parallel long context reaches ~1M)
DEGREE_MAX = 2**20  # ranks in one parallel dimension
WORLD_MAX = 2**24  # ranks in one job (NGPU x nodes, --dry-run.world_size)
VOCAB_MAX = 2**31 - 1  # token ids are int32 in titanlite's shards and embedding lookups
SECONDS_MAX = 30 * 24 * 3600  # a timeout of 30 days; c10d holds it in int64 milliseconds
SEED_MAX = 2**32 - 1  # what every generator the seed reaches takes (numpy's legacy one too)
TRACE_MAX = 2**31 - 1  # NCCL reads TORCH_NCCL_TRACE_BUFFER_SIZE as an int32


def opt(default: Any, help: str = "", **meta: Any) -> Any:
    """A config field: its default, a one-line help, and loader metadata."""
    meta["help"] = help
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class Job:
    config_file: str | None = opt(None, "TOML file this config was loaded from")
    dump_folder: str = opt("./outputs", "every output of the run lives under this folder")
    description: str = opt("", "free text")
    print_config: bool = opt(False, "print the resolved config at start")
    print_args: bool = opt(False, "TorchTitan's name for print_config")
    use_for_integration_test: bool = opt(False, "a tag TorchTitan uses; no effect")
    requeue_on_preemption: bool = opt(
        True,
        "under SLURM, `scontrol requeue` the job after the checkpoint that SIGTERM/SIGUSR1 "
        "triggers (see docs/slurm.md)",
    )


@dataclass
class Profiling:
    enable_profiling: bool = opt(False, "record torch.profiler traces")
    save_traces_folder: str = opt("profile_trace", "under job.dump_folder")
    profile_freq: int = opt(10, "steps between traces", min=1, max=STEPS_MAX)
    enable_memory_snapshot: bool = opt(
        False, "CUDA allocator snapshots every profile_freq steps and on OOM"
    )
    save_memory_snapshot_folder: str = opt("memory_snapshot", "under job.dump_folder")


@dataclass
class Metrics:
    log_freq: int = opt(10, "steps between metric lines", min=1, max=STEPS_MAX)
    enable_tensorboard: bool = opt(False, "write TensorBoard scalars")
    disable_color_printing: bool = opt(False, "plain console lines")
    save_tb_folder: str = opt("tb", "TensorBoard folder under job.dump_folder")
    save_for_all_ranks: bool = opt(False, "TensorBoard from every rank, under rank_N/")
    enable_wandb: bool = opt(
        False,
        "log the same scalars and the config to Weights & Biases (rank 0; project, entity, "
        "mode from WANDB_PROJECT, WANDB_ENTITY, WANDB_MODE; docs/monitoring.md)",
    )
    peak_flops: float | None = opt(
        None, "peak FLOP/s per device for MFU (default: from a table of known GPUs)", min=0.0
    )


@dataclass
class Model:
    name: str = opt("llama3", "model family", choices=["llama3", "qwen3", "deepseek_v3"])
    flavor: str = opt("debugmodel", "named size within the family")
    tokenizer_path: str = opt("", "tokenizer.json (Hugging Face tokenizers); '' = built-in")
    converters: list[str] = opt(
        [], "model converters applied before parallelizing", choices=["float8"]
    )
    print_after_conversion: bool = opt(False, "print the model after conversion")
    attn_type: str = opt(
        "auto",
        "attention kernel: 'auto' picks per device (block_causal, and any mask under context "
        "parallel: per-document 'varlen' on CPU and on CUDA in 16-bit; on CUDA in float32 "
        "FlexAttention, or masked 'sdpa' under context parallel; causal: SDPA's is_causal); "
        "'sdpa' (a dense mask for block_causal and under context parallel), 'flex' (compiled "
        "FlexAttention; training needs a GPU; not under context parallel), 'varlen' "
        "(attention per document: torch's flash varlen on CUDA, titanlite's CPU kernel; "
        "docs/performance.md)",
        choices=["auto", "sdpa", "flex", "varlen"],
    )
    attn_mask_type: str = opt(
        "block_causal",
        "'block_causal': a token attends only to its own document (documents start at each "
        "BOS) and the target after each EOS gets no loss; 'causal': the whole window, every "
        "target counted",
        choices=["causal", "block_causal"],
    )
    rope_positions: str = opt(
        "window",
        "RoPE positions: 'window' counts from the window start (as TorchTitan); 'document' "
        "restarts at each document's first token (needs attn_mask_type = 'block_causal', under "
        "which both are the same function up to float rounding; docs/data.md)",
        choices=["window", "document"],
    )
    # Shape overrides for experiments; None keeps the flavor's value.
    dim: int | None = opt(None, "hidden size", min=1, max=WIDTH_MAX)
    n_layers: int | None = opt(None, "transformer blocks", min=1, max=WIDTH_MAX)
    n_heads: int | None = opt(None, "attention heads", min=1, max=WIDTH_MAX)
    n_kv_heads: int | None = opt(None, "key/value heads (GQA)", min=1, max=WIDTH_MAX)
    multiple_of: int | None = opt(None, "FFN hidden size rounding", min=1, max=WIDTH_MAX)
    ffn_dim_multiplier: float | None = opt(None, "FFN hidden size multiplier", min=0.0)
    norm_eps: float | None = opt(None, "RMSNorm epsilon", min=0.0)
    rope_theta: float | None = opt(None, "RoPE base", min=0.0)
    # Mixture of Experts (the MoE flavors; docs/moe.md). None keeps the flavor's value.
    moe_load_balance: str | None = opt(
        None,
        "MoE load balancing: 'aux_loss' (the Switch loss per sequence, Qwen3's), 'expert_bias' "
        "(DeepSeek-V3's auxiliary-loss-free bias, updated after each step from the global "
        "tokens-per-expert counts) or 'none'",
        choices=["aux_loss", "expert_bias", "none"],
    )
    moe_aux_loss_coef: float | None = opt(None, "MoE auxiliary loss coefficient", min=0.0)
    moe_bias_update_rate: float | None = opt(None, "MoE expert-bias step per update", min=0.0)
    moe_routed_scaling_factor: float | None = opt(
        None, "MoE: the routed experts' weights are multiplied by this (DeepSeek-V3: 2.5)", min=0.0
    )
    moe_n_group: int | None = opt(
        None,
        "MoE group-limited routing: expert groups (DeepSeek-V3: 8; 1 = none)",
        min=1,
        max=WIDTH_MAX,
    )
    moe_topk_group: int | None = opt(
        None,
        "MoE group-limited routing: the groups a token's experts come from",
        min=1,
        max=WIDTH_MAX,
    )
    moe_seq_aux_loss_coef: float | None = opt(
        None, "MoE: DeepSeek-V3's sequence-wise balance loss coefficient; 0 = off", min=0.0
    )
    # DeepSeek-V3 (docs/architecture.md): multi-head latent attention and multi-token prediction.
    q_lora_rank: int | None = opt(
        None,
        "MLA query latent width; 0 = queries straight from the hidden state",
        min=0,
        max=WIDTH_MAX,
    )
    kv_lora_rank: int | None = opt(None, "MLA key/value latent width", min=1, max=WIDTH_MAX)
    qk_nope_head_dim: int | None = opt(
        None, "MLA query/key width without RoPE", min=1, max=WIDTH_MAX
    )
    qk_rope_head_dim: int | None = opt(
        None,
        "MLA rotated query/key width (one rotated key shared by the heads)",
        min=2,
        max=WIDTH_MAX,
    )
    v_head_dim: int | None = opt(None, "MLA value width", min=1, max=WIDTH_MAX)
    first_k_dense_replace: int | None = opt(
        None, "dense blocks before the MoE blocks (DeepSeek-V3: 3)", min=0, max=WIDTH_MAX
    )
    mtp_depth: int | None = opt(
        None, "multi-token prediction modules (DeepSeek-V3: 1; 0 = off)", min=0, max=64
    )
    mtp_loss_weight: float | None = opt(
        None, "weight of the MTP modules' mean loss in the objective (DeepSeek-V3: 0.3)", min=0.0
    )
    rope_factor: float | None = opt(
        None, "YaRN context extension factor (DeepSeek-V3: 40; 1 = plain RoPE)", min=1.0
    )


@dataclass
class Optimizer:
    name: str = opt(
        "AdamW",
        "optimizer; Muon: orthogonalized momentum for the hidden matrices, AdamW for the rest "
        "(docs/optimizers.md)",
        choices=["AdamW", "Adam", "Muon"],
    )
    lr: float = opt(8e-4, "peak learning rate (under Muon: of the Muon matrices)", min=0.0)
    beta1: float = opt(0.9, "Adam first-moment decay (under Muon: its AdamW group's)", min=0.0)
    beta2: float = opt(0.95, "Adam second-moment decay (under Muon: its AdamW group's)", min=0.0)
    eps: float = opt(1e-8, "Adam denominator epsilon (under Muon: its AdamW group's)", min=0.0)
    weight_decay: float = opt(
        0.1, "decoupled weight decay (under Muon: of the Muon matrices)", min=0.0
    )
    # Muon (torch.optim.Muon's names; its eps is muon_eps here, eps being AdamW's).
    momentum: float = opt(0.95, "Muon: momentum, within [0, 1)", min=0.0)
    nesterov: bool = opt(True, "Muon: Nesterov momentum")
    ns_steps: int = opt(5, "Muon: Newton-Schulz iterations", min=1, max=99)
    ns_coefficients: list[float] = opt(
        [3.4445, -4.775, 2.0315], "Muon: the quintic Newton-Schulz coefficients (a, b, c)"
    )
    muon_eps: float = opt(1e-7, "Muon: the Newton-Schulz normalization's epsilon", min=0.0)
    muon_ns_dtype: str = opt(
        "bfloat16",
        "Muon: the Newton-Schulz iteration's dtype; bfloat16 as torch (its rounding differs "
        "between layouts at ~1e-3: docs/optimizers.md), float32 to compare layouts at 1e-4",
        choices=["bfloat16", "float32"],
    )
    adjust_lr_fn: str = opt(
        "match_rms_adamw",
        "Muon: the per-matrix LR scale; match_rms_adamw (0.2 sqrt(max(A, B)), Moonlight's: one "
        "lr serves both groups) or original (sqrt(max(1, A / B)), torch's default)",
        choices=["match_rms_adamw", "original"],
    )
    adamw_lr: float | None = opt(
        None,
        "Muon: peak LR of its AdamW group (embedding, head, norms, routers); None = lr",
        min=0.0,
    )
    adamw_weight_decay: float | None = opt(
        None, "Muon: weight decay of its AdamW group's matrices; None = weight_decay", min=0.0
    )
    muon_exclude: list[str] = opt(
        [],
        "Muon: fnmatch patterns of parameter names left to AdamW, besides those always are "
        "(embeddings, the output head, routers, vectors)",
    )
    implementation: str = opt(
        "fused", "fused / foreach / for-loop", choices=["fused", "foreach", "for-loop"]
    )
    early_step_in_backward: bool = opt(
        False, "step each parameter during backward", unsupported=True
    )


@dataclass
class LRScheduler:
    warmup_steps: int = opt(
        200, "linear warmup steps; the peak LR is reached at the last of them", min=0, max=STEPS_MAX
    )
    decay_ratio: float | None = opt(
        None, "fraction of steps spent decaying (WSD); None = all steps after warmup", min=0.0
    )
    decay_type: str = opt("linear", "decay shape", choices=["linear", "sqrt", "cosine"])
    lr_min: float = opt(
        0.0,
        "LR floor as a fraction of the peak; the decay reaches it one step after the last step "
        "(as TorchTitan)",
        min=0.0,
    )


@dataclass
class Training:
    dataset: str = opt(
        "titanlite_corpus", "built-in dataset name (used when dataset_path is unset)"
    )
    dataset_path: str | None = opt(
        None,
        "text (.txt/.jsonl/.parquet file or folder, or a Hugging Face save_to_disk folder) or "
        "prepared shards (manifest.json or its folder)",
    )
    dataset_text_field: str = opt(
        "text", "the text field of .jsonl records, .parquet rows and Hugging Face dataset rows"
    )
    local_batch_size: int = opt(8, "sequences per rank per micro-batch", min=1, max=WIDTH_MAX)
    global_batch_size: int = opt(
        -1,
        "sequences per optimizer step; -1 = local x dp (no accumulation)",
        min=1,
        max=GLOBAL_BATCH_MAX,
        sentinel=(-1, "local x dp"),
    )
    seq_len: int = opt(2048, "tokens per sequence", min=1, max=SEQ_MAX)
    max_norm: float = opt(1.0, "gradient-norm clipping; 0 disables it", min=0.0)
    steps: int = opt(10000, "optimizer steps", min=1, max=STEPS_MAX)
    enable_cpu_offload: bool = opt(False, "FSDP2 CPU offload of parameters and gradients")
    mixed_precision_param: str = opt(
        "bfloat16",
        "parameter dtype in compute ('float16' is refused: there is no gradient scaler)",
        choices=["float32", "bfloat16", "float16"],
    )
    mixed_precision_reduce: str = opt(
        "float32", "gradient reduce dtype", choices=["float32", "bfloat16"]
    )
    compile: bool = opt(False, "torch.compile each transformer block and the loss")
    gc_freq: int = opt(50, "steps between garbage collections", min=1, max=STEPS_MAX)
    seed: int | None = opt(
        None, "seed; None = random, broadcast from rank 0 and logged", min=0, max=SEED_MAX
    )
    deterministic: bool = opt(False, "deterministic algorithms (slower)")
    skip_nonfinite_steps: int = opt(
        0,
        "consecutive steps with a non-finite gradient norm whose update is skipped before the "
        "run stops (exit 3); 0 = stop at the first",
        min=0,
        max=STEPS_MAX,
    )


@dataclass
class Parallelism:
    data_parallel_replicate_degree: int = opt(1, "HSDP/DDP replicas", min=1, max=DEGREE_MAX)
    data_parallel_shard_degree: int = opt(
        -1,
        "FSDP shards; -1 = what the world size leaves",
        min=1,
        max=DEGREE_MAX,
        sentinel=(-1, "use what the world size leaves"),
    )
    fsdp_reshard_after_forward: str = opt(
        "default", "free gathered params after forward", choices=["default", "always", "never"]
    )
    fsdp_sync_grads_each_microbatch: bool = opt(
        True, "reduce-scatter per micro-batch (least memory) rather than once per step"
    )
    tensor_parallel_degree: int = opt(
        1, "tensor-parallel ranks (innermost mesh dim)", min=1, max=DEGREE_MAX
    )
    disable_loss_parallel: bool = opt(False, "gather logits before the loss under TP")
    enable_async_tensor_parallel: bool = opt(False, "async TP (CUDA + compile)")
    enable_compiled_autograd: bool = opt(False, "compiled autograd", unsupported=True)
    pipeline_parallel_degree: int = opt(
        1, "pipeline-parallel ranks (outermost mesh dim)", min=1, max=DEGREE_MAX
    )
    pipeline_parallel_schedule: str = opt(
        "1F1B",
        "torch.distributed.pipelining schedule: 1F1B, GPipe, Interleaved1F1B, LoopedBFS, "
        "InterleavedZeroBubble, ZBVZeroBubble, ...",
    )
    pipeline_parallel_schedule_csv: str = opt(
        "", "a schedule as a CSV of actions per rank (overrides pipeline_parallel_schedule)"
    )
    pipeline_parallel_microbatch_size: int = opt(
        1,
        "sequences per pipeline micro-batch (splits training.local_batch_size)",
        min=1,
        max=WIDTH_MAX,
    )
    pipeline_parallel_layers_per_stage: int | None = opt(
        None,
        "blocks per stage (the embedding and the output count as layers, see the *_less_layers "
        "options); None = 1 stage per rank, or 2 for looped schedules",
        min=1,
        max=WIDTH_MAX,
    )
    pipeline_parallel_first_stage_less_layers: int = opt(
        1, "blocks the first stage gives up for the embedding", min=0, max=WIDTH_MAX
    )
    pipeline_parallel_last_stage_less_layers: int = opt(
        1, "blocks the last stage gives up for the final norm and output", min=0, max=WIDTH_MAX
    )
    pipeline_parallel_split_points: list[str] = opt(
        [], "pipeline stage boundaries (use pipeline_parallel_layers_per_stage)", unsupported=True
    )
    context_parallel_degree: int = opt(
        1,
        "context-parallel ranks: each holds a part of every sequence (between dp_shard and tp)",
        min=1,
        max=DEGREE_MAX,
    )
    context_parallel_load_balancer: str = opt(
        "headtail",
        "how the sequence is cut over the cp ranks: headtail (rank i holds chunks i and "
        "2cp-1-i of 2cp, even causal work) or none (contiguous)",
        choices=["headtail", "none"],
    )
    context_parallel_rotate_method: str = opt(
        "allgather",
        "how cp ranks exchange keys and values: allgather (alltoall is not built)",
        choices=["allgather", "alltoall"],
    )
    expert_parallel_degree: int = opt(
        1,
        "ranks an MoE's experts are split over (all-to-all token dispatch), borrowed from "
        "data_parallel_shard x context_parallel x tensor_parallel",
        min=1,
        max=DEGREE_MAX,
    )


@dataclass
class Checkpoint:
    enable_checkpoint: bool = opt(False, "save DCP checkpoints (and resume from the latest)")
    folder: str = opt("checkpoint", "under job.dump_folder")
    interval: int = opt(500, "steps between saves", min=1, max=STEPS_MAX)
    async_mode: str = opt(
        "disabled",
        "how saves overlap training",
        choices=["disabled", "async", "async_with_pinned_mem"],
    )
    keep_latest_k: int = opt(10, "checkpoints kept; 0 = keep all", min=0, max=STEPS_MAX)
    timeout_seconds: int = opt(
        1800,
        "collective timeout of the checkpoint's own process group: a save waits there for the "
        "slowest writer (and a load for the slowest reader), which on a shared filesystem can "
        "take far longer than comm.train_timeout_seconds",
        min=1,
        max=SECONDS_MAX,
    )
    model_weights_only: bool = opt(False, "save the model only")
    last_save_model_weights_only: bool = opt(False, "final save holds the model only")
    export_dtype: str = opt(
        "float32", "dtype of a weights-only final save", choices=["float32", "bfloat16", "float16"]
    )
    load_step: int = opt(
        -1, "step to resume from; -1 = latest", min=0, max=STEPS_MAX, sentinel=(-1, "the latest")
    )
    create_seed_checkpoint: bool = opt(False, "write step-0 model weights (1 process) and exit")
    exclude_from_loading: list[str] = opt(
        [], "state keys not restored on resume", choices=CHECKPOINT_KEYS
    )
    initial_load_path: str | None = opt(None, "checkpoint to start from when the folder has none")
    initial_load_model_weights_only: bool = opt(True, "start from model weights only")
    initial_load_in_hf: bool = opt(
        False, "initial_load_path is a Hugging Face Llama folder (safetensors + config.json)"
    )
    last_save_in_hf: bool = opt(
        False,
        "also export the final checkpoint as a Hugging Face folder (<folder>/hf-step-N, in "
        "export_dtype)",
    )
    export_mtp: bool = opt(
        False,
        "the Hugging Face export also writes the multi-token-prediction modules (DeepSeek-V3's "
        "layer n_layers + k, as the published checkpoints hold them); off: the main model only",
    )
    enable_first_step_checkpoint: bool = opt(False, "also save after step 1")
    overwrite: bool = opt(False, "allow replacing an existing step-N written by another run")
    apply_new_optimizer_settings: bool = opt(
        False,
        "on resume, apply [optimizer] lr/betas/eps/weight_decay from the config instead of the "
        "checkpoint's (which otherwise continue, with a warning)",
    )
    allow_partial_model_load: bool = opt(
        False,
        "load a checkpoint holding more model tensors than the configured model (e.g. fewer "
        "blocks: fine-tuning a truncated model), leaving the rest out; off, that is refused",
    )
    on_save_error: str = opt(
        "stop",
        "a save that fails (e.g. disk full): stop the run (exit 2), or warn and retry at the "
        "next interval",
        choices=["stop", "continue"],
    )


@dataclass
class ActivationCheckpoint:
    mode: str = opt(
        "selective",
        "recompute activations; memory_budget lets torch.compile choose (needs training.compile)",
        choices=["none", "selective", "full", "memory_budget"],
    )
    selective_ac_option: str = opt("2", "an integer N (every N-th block) or 'op'")
    memory_budget: float = opt(
        0.5,
        "under mode memory_budget, the fraction of each block's activations beyond its inputs "
        "that compile may keep: 0 recomputes all (as full), 1 keeps what compile would anyway",
        min=0.0,
        max=1.0,
    )


@dataclass
class Float8:
    # Read when model.converters holds "float8"; see docs/float8.md.
    recipe_name: str = opt(
        "tensorwise",
        "how float8 scales are computed",
        choices=["tensorwise", "rowwise", "rowwise_with_gw_hp"],
    )
    enable_fsdp_float8_all_gather: bool = opt(
        False, "all-gather FSDP weights in float8 (tensorwise)"
    )
    precompute_float8_dynamic_scale_for_fsdp: bool = opt(
        False, "all weight scales in one all-reduce after each optimizer step"
    )
    filter_fqns: list[str] = opt(
        ["output"], "Linear layers whose name contains one stay high precision"
    )
    emulate: bool = opt(False, "float8 casts with high-precision matmuls (any GPU or CPU)")


@dataclass
class ValidationSource:
    """One `[[validation.sources]]` table: a held-out set with a loss of its own."""

    name: str = opt("", "the set's name (in metrics: val_loss_<name>)")
    path: str = opt("", "held-out text or prepared shards, as validation.dataset_path takes")


@dataclass
class Validation:
    enabled: bool = opt(False, "compute a validation loss on held-out data during training")
    dataset_path: str | None = opt(
        None, "held-out text or prepared shards, as training.dataset_path"
    )
    local_batch_size: int | None = opt(
        None, "sequences per rank per step; None = training's", min=1, max=WIDTH_MAX
    )
    seq_len: int | None = opt(None, "tokens per sequence; None = training's", min=1, max=SEQ_MAX)
    freq: int = opt(
        100, "steps between validations (and after the last step)", min=1, max=STEPS_MAX
    )
    steps: int = opt(
        -1,
        "batches per validation; -1 = every whole global batch of the data",
        min=1,
        max=STEPS_MAX,
        sentinel=(-1, "all the data"),
    )
    sources: list[ValidationSource] = opt(
        [],
        "named held-out sets ([[validation.sources]]), each with its loss val_loss_<name>; "
        "none: dataset_path alone",
    )


@dataclass
class Eval:
    """`[eval]`: downstream multiple-choice tasks scored in the loop (docs/evaluation.md)."""

    enabled: bool = opt(
        False, "score downstream multiple-choice tasks by log-likelihood during training"
    )
    tasks: list[str] = opt(
        ["titanlite_mc"],
        "built-in task names (titanlite_mc) or files: an lm-eval task YAML (zero-shot "
        "multiple_choice over a local JSON/JSONL) or a JSONL of {context, choices, label}",
    )
    interval: int = opt(
        100, "steps between evaluations (and after the last step)", min=1, max=STEPS_MAX
    )
    limit: int = opt(
        -1,
        "examples per task (lm-eval's --limit); -1 = all",
        min=1,
        max=STEPS_MAX,
        sentinel=(-1, "every example"),
    )
    log_samples: bool = opt(
        False,
        "write each request's log-likelihood to eval_samples/step-<N>/<task>.jsonl under "
        "job.dump_folder (lm-eval's --log_samples)",
    )


@dataclass
class Comm:
    init_timeout_seconds: int = opt(
        300, "collective timeout from start-up to the end of the first step", min=1, max=SECONDS_MAX
    )
    train_timeout_seconds: int = opt(
        100,
        "collective timeout once the first step is done (the checkpoint's group keeps "
        "checkpoint.timeout_seconds)",
        min=1,
        max=SECONDS_MAX,
    )
    trace_buf_size: int = opt(
        20000, "NCCL flight recorder entries per rank (CUDA only; 0 = off)", min=0, max=TRACE_MAX
    )
    save_traces_folder: str = opt(
        "comm_traces", "flight recorder dumps on a collective timeout, under job.dump_folder"
    )


@dataclass
class MixtureSource:
    """One `[[data.sources]]` table: a dataset of the mixture."""

    name: str = opt("", "the source's name (in metrics: tokens_<name>)")
    path: str = opt("", "prepared shards or text, as training.dataset_path takes")
    weight: float = opt(
        1.0, "relative weight; the weights are normalized over the sources", min=0.0
    )
    max_repetition: float = opt(
        1.0, "epochs of this source the run may read before it is refused", min=0.0
    )


@dataclass
class MixturePhase:
    """One `[[data.phases]]` table: from `start_step` on, the sources' weights are `weights`."""

    start_step: int = opt(1, "the phase's first training step", min=1, max=STEPS_MAX)
    weights: dict[str, float] = opt({}, "source name -> weight (sources left out: 0)")


@dataclass
class Data:
    weight_unit: str = opt(
        "tokens",
        "what a weight is a share of: training tokens, or documents",
        choices=["tokens", "documents"],
    )
    allow_mixture_change: bool = opt(
        False,
        "resume a checkpoint of another mixture, continuing each source from its recorded "
        "position (otherwise refused, naming what changed)",
    )
    sources: list[MixtureSource] = opt(
        [], "the mixture's sources ([[data.sources]]); none: training.dataset_path alone"
    )
    phases: list[MixturePhase] = opt(
        [], "later phases' weights ([[data.phases]]); the sources' own weights from step 1"
    )


@dataclass
class JobConfig:
    job: Job = field(default_factory=Job)
    profiling: Profiling = field(default_factory=Profiling)
    metrics: Metrics = field(default_factory=Metrics)
    model: Model = field(default_factory=Model)
    optimizer: Optimizer = field(default_factory=Optimizer)
    lr_scheduler: LRScheduler = field(default_factory=LRScheduler)
    training: Training = field(default_factory=Training)
    parallelism: Parallelism = field(default_factory=Parallelism)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    activation_checkpoint: ActivationCheckpoint = field(default_factory=ActivationCheckpoint)
    float8: Float8 = field(default_factory=Float8)
    validation: Validation = field(default_factory=Validation)
    eval: Eval = field(default_factory=Eval)
    comm: Comm = field(default_factory=Comm)
    data: Data = field(default_factory=Data)


# TorchTitan sections titanlite has no counterpart for yet: accepted when they hold these
# defaults (so a TorchTitan TOML loads), refused otherwise.
UNIMPLEMENTED_SECTIONS: dict[str, dict[str, Any]] = {
    "experimental": {"custom_import": "", "custom_args_module": ""},
    "fault_tolerance": {"enable": False},
    "memory_estimation": {"enabled": False, "disable_fake_mode": False},
    "mx": {},
}


# TorchTitan's spellings of keys titanlite has under another name, (section, key) -> (section,
# key): accepted, with a one-line note giving titanlite's spelling. Older and newer TorchTitan
# releases differ here (local_batch_size was batch_size; v0.2 moved checkpoint, compile,
# float8 and validation switches and replaced tokenizer_path by hf_assets_path).
RENAMED_KEYS: dict[tuple[str, str], tuple[str, str]] = {
    ("training", "batch_size"): ("training", "local_batch_size"),
    ("model", "hf_assets_path"): ("model", "tokenizer_path"),
    ("checkpoint", "enable"): ("checkpoint", "enable_checkpoint"),
    ("checkpoint", "last_save_model_only"): ("checkpoint", "last_save_model_weights_only"),
    ("lr_scheduler", "min_lr_factor"): ("lr_scheduler", "lr_min"),
    ("validation", "enable"): ("validation", "enabled"),
    ("compile", "enable"): ("training", "compile"),
}
# TorchTitan's nested tables that are one titanlite section.
RENAMED_SECTIONS: dict[str, str] = {"quantize.linear.float8": "float8"}
# TorchTitan keys for things titanlite does differently: accepted at these values (what
# titanlite does anyway), refused otherwise.
FIXED_KEYS: dict[tuple[str, str], Any] = {
    # titanlite compiles the blocks and the loss together when training.compile is on.
    ("compile", "components"): ["model", "loss"],
}
# TorchTitan keys that name things titanlite has no counterpart for and that have no effect
# here: accepted with a note saying what titanlite reads instead.
IGNORED_KEYS: dict[tuple[str, str], str] = {
    ("validation", "dataset"): "titanlite has no named validation sets; it validates on "
    "validation.dataset_path",
    ("float8", "force_recompute_fp8_weight_in_bwd"): "torchao 0.18 no longer reads it (a "
    "deprecated no-op there), so titanlite dropped it",
}
