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
from torch import nn

from models import ModelArgs, TrainableModel
from parallelisms import Meshes, ParallelDims, ParallelizeOptions
from parallelisms.context_parallel import SequenceShards
from parallelisms.float8 import ConversionPlan, register_scale_precompute
from parallelisms.pipeline import (
    ModelParts,
    describe,
    num_stages,
    split_layers,
    stage_ids,
)
from titanlite.build.options import parallelize_options, pipeline_options
from titanlite.components import optim
from titanlite.components.loss import cross_entropy_sum
from titanlite.config.schema import JobConfig
from titanlite.families import ModelFamily, get_family


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
    summary = describe(pp, dims.pp, layers, n_mb)
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
