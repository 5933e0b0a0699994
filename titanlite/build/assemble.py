"""Assembly: config sections -> the parallelized model, its loss and its optimizer.

The one place where "build the model for this layout" happens, shared by the trainer and the dry
run, so that the dry run plans exactly what training builds:

    build_model: model on the meta device -> (pipeline stages: copies that keep only their own
                 parts) -> family's parallelize for each (float8 -> TP -> AC -> compile ->
                 FSDP/DDP); nothing is allocated yet
    materialize: local shards allocated (to_empty) and filled by the layout-invariant init
    build_optimizer: the optimizer on the sharded parameters (+ float8 scale precompute)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from models import ModelArgs, TrainableModel
from parallelisms import Meshes, ParallelDims, ParallelizeOptions
from parallelisms.context_parallel import SequenceShards
from parallelisms.float8 import ConversionPlan, Float8Options, register_scale_precompute
from parallelisms.pipeline import (
    ModelParts,
    PipelineOptions,
    describe,
    num_stages,
    split_layers,
    stage_ids,
)
from titanlite.components import optim
from titanlite.config.schema import JobConfig
from titanlite.core.dtypes import DTYPES
from titanlite.families import ModelFamily, get_family


def float8_options(job: JobConfig, *, fsdp_enabled: bool, device_type: str) -> Float8Options | None:
    """The [float8] section as parallelisms' options; None when float8 is off."""
    if "float8" not in job.model.converters:
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


def parallelize_options(job: JobConfig, dims: ParallelDims, device_type: str) -> ParallelizeOptions:
    t, p, ac = job.training, job.parallelism, job.activation_checkpoint
    return ParallelizeOptions(
        loss_parallel=dims.tp_enabled and not p.disable_loss_parallel,
        async_tp=p.enable_async_tensor_parallel,
        ac_mode=ac.mode,
        ac_option=ac.selective_ac_option,
        ac_memory_budget=ac.memory_budget,
        compile=t.compile,
        param_dtype=DTYPES[t.mixed_precision_param],
        reduce_dtype=DTYPES[t.mixed_precision_reduce],
        reshard_after_forward=p.fsdp_reshard_after_forward,
        cpu_offload=t.enable_cpu_offload,
        float8=float8_options(job, fsdp_enabled=dims.fsdp_enabled, device_type=device_type),
    )


def pipeline_options(job: JobConfig) -> PipelineOptions:
    p = job.parallelism
    return PipelineOptions(
        schedule=p.pipeline_parallel_schedule,
        schedule_csv=p.pipeline_parallel_schedule_csv,
        microbatch_size=p.pipeline_parallel_microbatch_size,
        layers_per_stage=p.pipeline_parallel_layers_per_stage,
        first_stage_less_layers=p.pipeline_parallel_first_stage_less_layers,
        last_stage_less_layers=p.pipeline_parallel_last_stage_less_layers,
    )


IGNORE_INDEX = -100  # a label that gets no loss (cross_entropy's default ignore_index)


def cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed over the counted targets: the trainer divides by the count over every data-parallel
    rank and micro-batch, so that each counted token weighs the same however the global batch
    is split (a mean per micro-batch would weigh tokens by how few others their micro-batch
    counts). Works on vocab-sharded DTensor logits under loss parallel too."""
    # In float32 whatever the compute dtype: a bf16 log-softmax over 128K classes loses bits.
    return F.cross_entropy(
        logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
    )


def cross_entropy_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean over the counted targets of one batch (tools and tests; the trainer sums)."""
    return F.cross_entropy(
        logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX
    )


def ignore_boundary_targets(labels: torch.Tensor, bos_id: int) -> torch.Tensor:
    """Labels with the first token of each document ignored: predicting it would mean predicting
    across the boundary from the previous document, which block_causal attention cannot see.
    Documents are framed BOS ... EOS by both readers, so these are the targets after each EOS."""
    return labels.masked_fill(labels == bos_id, IGNORE_INDEX)


LocalBatch = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]


def local_batch(
    shards: SequenceShards | None, inputs: torch.Tensor, labels: torch.Tensor
) -> LocalBatch:
    """(model input, the window for the model's `tokens=`, labels) of this rank: under context
    parallel its part of each sequence, with the whole window for the mask and positions."""
    if shards is None:
        return inputs, None, labels
    return shards.shard(inputs), inputs, shards.shard(labels)


def model_kwargs(tokens: torch.Tensor | None) -> dict:
    """The model's `tokens=` when its input is a part of the window (context parallel)."""
    return {} if tokens is None else {"tokens": tokens}


def build_loss_fn(job: JobConfig) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    return torch.compile(cross_entropy_sum) if job.training.compile else cross_entropy_sum


@dataclass
class BuiltModel:
    # This rank's parameters under the whole model's names (checkpoint, optimizer, clipping).
    model: nn.Module
    family: ModelFamily
    options: ParallelizeOptions
    float8_plan: ConversionPlan | None  # what float8 converted, when it is on
    # What runs: [model] without pipeline parallel, else this rank's stages (`stage_ids` of
    # `num_stages`).
    parts: list[nn.Module]
    stage_ids: list[int]
    num_stages: int = 1
    pipeline_summary: str = ""  # the split, micro-batches and bubble, for the log and dry run
    # Under pipeline parallel, the block numbers of every stage (whatever the family's modules).
    stage_layers: list[list[int]] = dataclasses.field(default_factory=list)

    @property
    def loss_parallel(self) -> bool:
        return self.options.loss_parallel

    @property
    def sequence_shards(self) -> SequenceShards | None:
        return self.options.sequence_shards


def build_model(
    job: JobConfig, dims: ParallelDims, args: ModelArgs, meshes: Meshes, device_type: str
) -> BuiltModel:
    """The model of `job` (hyper-parameters `args`) on the meta device, parallelized for `dims`
    over `meshes`."""
    family = get_family(job.model.name)
    with torch.device("meta"):
        model = family.model.model_cls(args)
    options = parallelize_options(job, dims, device_type)
    if dims.cp_enabled:
        shards = SequenceShards(meshes.get("cp"), job.parallelism.context_parallel_load_balancer)
        options = dataclasses.replace(options, sequence_shards=shards)
    if not dims.pp_enabled:
        float8_plan = family.parallelize(model, dims, meshes, options)
        return BuiltModel(model, family, options, float8_plan, [model], [0])
    pp = pipeline_options(job)
    n_layers = args.n_layers
    stages = num_stages(dims.pp, n_layers, pp)
    layers = split_layers(n_layers, stages, pp.first_stage_less_layers, pp.last_stage_less_layers)
    ids = stage_ids(meshes.get("pp").get_local_rank(), dims.pp, stages, pp.schedule)
    parts = family.split_stages(model, layers, ids)
    plans = [family.parallelize(part, dims, meshes, options) for part in parts]
    n_mb = job.training.local_batch_size // pp.microbatch_size
    summary = describe(pp.schedule, dims.pp, layers, n_mb, pp.microbatch_size)
    return BuiltModel(
        ModelParts(parts), family, options, plans[0], parts, ids, stages, summary, layers
    )


def materialize(built: BuiltModel, device: torch.device, seed: int) -> nn.Module:
    """Allocate this rank's shards and fill them: each element depends only on (seed, name,
    index in the full tensor), so every layout starts from the same weights."""
    for part in built.parts:
        part.to_empty(device=torch.device("cpu") if built.options.cpu_offload else device)
        cast(TrainableModel, part).init_weights(seed, buffer_device=device)
        part.train()
    return built.model


def build_optimizer(job: JobConfig, built: BuiltModel) -> torch.optim.Optimizer:
    optimizer = optim.build_optimizer(built.model, job.optimizer)
    f8 = built.options.float8
    if f8 is not None and f8.precompute_scale:
        register_scale_precompute(optimizer, built.model)
    return optimizer
