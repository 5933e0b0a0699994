"""Pipeline parallel on torch's own engine, `torch.distributed.pipelining`.

The model is cut into stages by deleting from a copy of the meta model what a stage does not own:
the first stage keeps the embedding, the last the final norm and the output, and each keeps its
own run of blocks (the `layers` ModuleDict is keyed by layer number, so the names, and therefore
checkpoint keys and the layout-invariant init, are those of the whole model). Each stage is then
parallelized like a whole model (float8 -> TP -> AC -> compile -> FSDP) on its own submesh, and a
schedule of `torch.distributed.pipelining` runs the micro-batches through the stages.

Single-stage schedules (1F1B, GPipe) give each pp rank one stage; looped ones (Interleaved1F1B,
LoopedBFS, InterleavedZeroBubble) give rank r the stages r, r + pp, ...; V-shaped ones
(ZBVZeroBubble, DualPipeV) give rank r the stages r and 2 pp - 1 - r.

Knows the model only through its public structure: `tok_embeddings`, `layers`, `norm`, `output`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    PipelineScheduleSingle,
    _PipelineSchedule,
    _PipelineScheduleRuntime,
    get_schedule_class,
)

from parallelisms.options import PipelineOptions
from parallelisms.parallel_dims import LayoutError
from parallelisms.pipeline_csv import read_schedule_csv

V_SCHEDULES = ("zbvzerobubble", "dualpipev")  # two stages per rank, folded back


def schedule_class(name: str) -> type:
    try:
        return get_schedule_class(name)
    except ValueError:
        known = "1F1B, GPipe, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV"
        raise LayoutError(
            f"parallelism.pipeline_parallel_schedule = {name!r} is not a schedule of "
            f"torch.distributed.pipelining; use one of {known}"
        ) from None


def is_single_stage(name: str) -> bool:
    return issubclass(schedule_class(name), PipelineScheduleSingle)


def num_stages(pp: int, n_layers: int, opts: PipelineOptions) -> int:
    """Stages over all pp ranks: from layers_per_stage (the embedding and the output count as
    first/last_stage_less_layers blocks each), else one per rank, two for multi-stage schedules."""
    if opts.layers_per_stage is None:
        return pp if is_single_stage(opts.schedule) else 2 * pp
    weight = n_layers + opts.first_stage_less_layers + opts.last_stage_less_layers
    return -(-weight // opts.layers_per_stage)


def split_layers(n_layers: int, stages: int, first_less: int, last_less: int) -> list[list[int]]:
    """The block numbers of each stage, in order. The embedding weighs `first_less` blocks and the
    final norm + output `last_less`, so the first and last stages get that many fewer blocks;
    the remainder goes to the middle stages first (they have nothing else to carry)."""
    weight = n_layers + first_less + last_less
    base, extra = divmod(weight, stages)
    sizes = [base] * stages
    order = list(range(1, stages - 1)) + [0, stages - 1] if stages > 2 else list(range(stages))
    for s in order[:extra]:
        sizes[s] += 1
    sizes[0] -= first_less
    sizes[-1] -= last_less
    if stages == 1:
        sizes = [n_layers]
    if min(sizes) < 0 or sum(sizes) != n_layers or any(n < 1 for n in sizes[1:-1]):
        raise LayoutError(
            f"{n_layers} block(s) do not split into {stages} pipeline stages with "
            f"first_stage_less_layers = {first_less} and last_stage_less_layers = {last_less} "
            f"(blocks per stage would be {sizes}); use fewer stages (pipeline_parallel_degree, "
            "pipeline_parallel_layers_per_stage) or smaller *_less_layers"
        )
    out, start = [], 0
    for n in sizes:
        out.append(list(range(start, start + n)))
        start += n
    return out


def stage_ids(pp_rank: int, pp: int, stages: int, schedule: str) -> list[int]:
    if stages % pp:
        raise LayoutError(
            f"{stages} pipeline stages do not spread evenly over pipeline_parallel_degree = {pp}; "
            "change pipeline_parallel_layers_per_stage"
        )
    per_rank = stages // pp
    if schedule.lower() in V_SCHEDULES:
        if per_rank != 2:
            raise LayoutError(
                f"pipeline_parallel_schedule = {schedule} runs exactly 2 stages per rank, not "
                f"{per_rank}; set pipeline_parallel_layers_per_stage so that there are "
                f"{2 * pp} stages (or leave it unset)"
            )
        return [pp_rank, 2 * pp - 1 - pp_rank]
    if per_rank > 1 and is_single_stage(schedule):
        raise LayoutError(
            f"pipeline_parallel_schedule = {schedule} runs one stage per rank, but there are "
            f"{per_rank} per rank; use a looped schedule (Interleaved1F1B, LoopedBFS, ...) or "
            "fewer stages"
        )
    return [pp_rank + k * pp for k in range(per_rank)]


def rank_stages(pp: int, stages: int, schedule: str) -> list[list[int]]:
    """The stage ids each pp rank holds, rank by rank."""
    return [stage_ids(r, pp, stages, schedule) for r in range(pp)]


def check_pipeline(pp: int, n_layers: int, local_batch_size: int, opts: PipelineOptions) -> None:
    """What can be known about a pipeline layout before any process group exists."""
    schedule_class(opts.schedule)
    stages = num_stages(pp, n_layers, opts)
    split_layers(n_layers, stages, opts.first_stage_less_layers, opts.last_stage_less_layers)
    stage_ids(0, pp, stages, opts.schedule)
    if local_batch_size % opts.microbatch_size:
        raise LayoutError(
            f"training.local_batch_size = {local_batch_size} is not divisible by "
            f"pipeline_parallel_microbatch_size = {opts.microbatch_size}"
        )
    n_mb = local_batch_size // opts.microbatch_size
    if opts.schedule_csv:
        read_schedule_csv(opts.schedule_csv, rank_stages(pp, stages, opts.schedule), n_mb)
    name = opts.schedule.lower()
    # The rules torch 2.13's schedules enforce in their constructors, said before launch.
    if name in ("1f1b", "dualpipev") and n_mb < stages:
        raise LayoutError(
            f"pipeline_parallel_schedule = {opts.schedule} needs at least as many micro-batches "
            f"as stages ({stages}), but local_batch_size / pipeline_parallel_microbatch_size = "
            f"{n_mb}; raise the local batch or lower the micro-batch size"
        )
    if name in ("interleaved1f1b", "interleavedzerobubble"):
        rounds = max(1, n_mb // pp)
        if n_mb % rounds:
            raise LayoutError(
                f"pipeline_parallel_schedule = {opts.schedule} needs the micro-batch count "
                f"({n_mb}) to be a multiple of its rounds ({rounds} = micro-batches // "
                f"pipeline_parallel_degree); use {rounds * pp} micro-batches per rank"
            )


ZERO_BUBBLE = ("interleavedzerobubble", "zbvzerobubble", "dualpipev")


def bubble_fraction(schedule: str, pp: int, stages_per_rank: int, n_microbatches: int) -> float:
    """The idle share of a step in theory, with forward and backward of equal cost per stage:
    (pp - 1) / (v m + pp - 1) for GPipe and 1F1B (v = 1) and the looped schedules (v stages per
    rank); zero-bubble schedules fill that time with weight-gradient work (0 when F, B and W
    cost the same, which real kernels only approach)."""
    if schedule.lower() in ZERO_BUBBLE:
        return 0.0
    return (pp - 1) / (stages_per_rank * n_microbatches + pp - 1)


def microbatches_in_flight(
    schedule: str, pp: int, pp_rank: int, stages_per_rank: int, n_microbatches: int
) -> tuple[int, bool]:
    """At the peak, how many (micro-batch, local stage) forwards a rank holds activations for,
    and whether that count follows the schedule's code exactly (False: an upper bound).
    GPipe and LoopedBFS run every forward before any backward; 1F1B's rank r warms up with
    pp - r forwards; torch's Interleaved1F1B with (v - 1) m_round + 2 (pp - 1 - r) + 1."""
    v, m, name = stages_per_rank, n_microbatches, schedule.lower()
    if name in ("gpipe", "loopedbfs"):
        return v * m, True
    if name == "1f1b":
        return min(m, pp - pp_rank), True
    if name == "interleaved1f1b":
        per_round = m // max(1, m // pp)
        return min(v * m, (v - 1) * per_round + 2 * (pp - 1 - pp_rank) + 1), True
    return v * m, False  # zero-bubble schedules: bounded by holding every forward


def stage_holds(layers_of_stages: list[list[int]]) -> list[str]:
    """What each stage holds, in words: "embedding + blocks 0-2", "block 3 + norm + output"."""
    out = []
    for i, blocks in enumerate(layers_of_stages):
        parts = ["embedding"] if i == 0 else []
        if blocks:
            parts.append(
                f"blocks {blocks[0]}-{blocks[-1]}" if len(blocks) > 1 else f"block {blocks[0]}"
            )
        if i == len(layers_of_stages) - 1:
            parts.append("norm + output")
        out.append(" + ".join(parts))
    return out


def describe(opts: PipelineOptions, pp: int, layers_of_stages: list[list[int]], n_mb: int) -> str:
    """The log's line: schedule, what each stage holds, micro-batches, bubble in theory."""
    stages, per_rank = len(layers_of_stages), len(layers_of_stages) // pp
    n_layers = sum(map(len, layers_of_stages))
    counted = ""
    if opts.layers_per_stage is not None:  # TorchTitan's count: a ceiling, not every stage's size
        weight = f"{n_layers} + {opts.first_stage_less_layers} + {opts.last_stage_less_layers}"
        counted = (
            f" = ceil(({weight}) / pipeline_parallel_layers_per_stage {opts.layers_per_stage})"
        )
    bubble = bubble_fraction(opts.schedule, pp, per_rank, n_mb)
    return (
        f"pipeline: {opts.schedule_csv or opts.schedule}, {stages} stages{counted} "
        f"({per_rank} per rank): {' | '.join(stage_holds(layers_of_stages))}; {n_mb} micro-batches of "
        f"{opts.microbatch_size}; bubble {bubble:.1%} of a step (in theory: forward = backward "
        "per stage)"
    )


def stage_models(
    model: nn.Module, layers_of_stages: list[list[int]], ids: list[int]
) -> list[nn.Module]:
    """Copies of the (meta) `model`, one per stage in `ids`, each holding only what it owns."""
    parts = []
    last = len(layers_of_stages) - 1
    for s in ids:
        part = copy.deepcopy(model)
        keep = {str(i) for i in layers_of_stages[s]}
        layers = cast(nn.ModuleDict, part.layers)
        for name in list(layers.keys()):
            if name not in keep:
                del layers[name]
        # Registered as None (not deleted): the model's forward and init skip absent parts.
        if s != 0:
            part.register_module("tok_embeddings", None)
        if s != last:
            part.register_module("norm", None)
            part.register_module("output", None)
        parts.append(part)
    return parts


class ModelParts(nn.Module):
    """This rank's stages seen as one model: their modules registered under the whole model's
    names, so that state dicts, the optimizer and checkpoints use the same keys as on any other
    layout. It holds the stages' modules, it does not run them."""

    def __init__(self, parts: list[nn.Module]):
        super().__init__()
        self.layers = nn.ModuleDict()
        for part in parts:
            for name in ("tok_embeddings", "norm", "output"):
                module = getattr(part, name, None)
                if module is not None:
                    self.register_module(name, module)
            for i, block in cast(nn.ModuleDict, part.layers).items():
                self.layers[i] = block


class _BufferKeepingStage(PipelineStage):
    """torch's stage, except that the forward it runs on the first step to learn the shapes it
    sends (torch 2.13's dynamic metadata inference: the first micro-batch on the first stage,
    uninitialized memory on the others) leaves the stage's buffers as they were. That forward
    is not training, but a layer that accumulates into a buffer counts it: an MoE's
    tokens-per-expert counts then moved the expert bias of step 1 unlike one process's."""

    def _forward_metadata_inference(self, *args: Any, **kwargs: Any) -> Any:
        buffers = list(self.submod.buffers())
        saved = [b.detach().clone() for b in buffers]
        try:
            return super()._forward_metadata_inference(*args, **kwargs)
        finally:
            # Only those it changed: a restored RoPE table would be a version bump under the
            # shape-learning backward that follows, which autograd refuses.
            with torch.no_grad():
                for buffer, value in zip(buffers, saved):
                    if not torch.equal(buffer, value):
                        buffer.copy_(value)


def build_schedule(
    parts: list[nn.Module],
    ids: list[int],
    stages: int,
    pp_mesh: DeviceMesh,
    device: torch.device,
    n_microbatches: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    opts: PipelineOptions,
) -> _PipelineSchedule:
    """The schedule over this rank's stages. The loss is summed, not averaged, over
    micro-batches (scale_grads=False): the trainer scales it by the global token count."""
    group = pp_mesh.get_group()
    pipeline_stages = [
        _BufferKeepingStage(part, s, stages, device, group=group) for part, s in zip(parts, ids)
    ]
    cls: Any = _PipelineScheduleRuntime if opts.schedule_csv else schedule_class(opts.schedule)
    if issubclass(cls, PipelineScheduleSingle):
        schedule = cls(pipeline_stages[0], n_microbatches, loss_fn=loss_fn, scale_grads=False)
    else:
        schedule = cls(pipeline_stages, n_microbatches, loss_fn=loss_fn, scale_grads=False)
    if opts.schedule_csv:
        # The actions preflight checked, not torch's own reading of the file (_load_csv).
        actions = read_schedule_csv(
            opts.schedule_csv, rank_stages(pp_mesh.size(), stages, opts.schedule), n_microbatches
        )
        runtime = cast(_PipelineScheduleRuntime, schedule)
        runtime.pipeline_order = actions
        runtime._prepare_schedule_with_comms(actions)
    return schedule
