"""Plan a run before it costs GPU hours: the real layout checks, mesh, parallelization and
optimizer, on meta tensors under a fake process group of the target world size, in one process.

    ./run_train.sh --config llama_70b.toml --dry-run --dry-run.world_size 256
    python -m titanlite.dry_run --config llama_70b.toml --dry-run.world_size 256
    plan(job_config, world_size) -> Plan                      # from Python

Parameter, gradient and optimizer-state bytes are exact: they are read off the sharded DTensors
(and the AdamW state created by a real optimizer step on meta tensors) of the given rank.
Activation memory comes from the family's documented formula (its estimator, e.g.
models/llama/estimate.py), combined in titanlite.planning.activation_memory.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from titanlite.config import loader as config_lib
from titanlite.config.schema import VOCAB_MAX, WORLD_MAX, JobConfig
from titanlite.core.errors import report
from titanlite.core.numbers import read_float, read_int
from titanlite.planning.activation_memory import ActivationEstimate, estimate_activations
from titanlite.planning.eval_plan import eval_cost
from titanlite.planning.expert_parallel import AllToAllPlan, all_to_all_plan
from titanlite.planning.headroom import communicators, headroom
from titanlite.planning.mixture_plan import mixture_plan
from titanlite.preflight.memory import keeps_unsharded_grads, warning_line

if TYPE_CHECKING:
    from titanlite.build.assemble import BuiltModel
    from titanlite.preflight.checks import Preflight

GIB = 2**30
KEPT_GRADS = "FSDP unsharded grads (accumulation)"


def tensors_bytes(tensors) -> int:
    """Bytes that (possibly sharded) tensors occupy on this rank: their local storages, each
    counted once (FSDP2's sharded gradients are views into one reduce-scatter buffer) and with
    padding (FSDP2 pads uneven shards). Meta tensors have no addresses: each is its own."""
    seen, total = set(), 0
    for t in tensors:
        storage = (t.to_local() if isinstance(t, DTensor) else t).untyped_storage()
        key = storage.data_ptr()
        if t.device.type != "meta" and key in seen:
            continue
        seen.add(key)
        total += storage.nbytes()
    return total


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Per-rank parameter, gradient and optimizer-state bytes (meta or real tensors; the
    optimizer's state may hold DTensors or their local shards)."""
    params = list(model.parameters())
    return {
        "parameters": tensors_bytes(params),
        "gradients": tensors_bytes(p.grad for p in params if p.grad is not None),
        "optimizer": tensors_bytes(
            v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)
        ),
    }


def moe_state_bytes(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, twin: torch.optim.Optimizer
) -> dict[str, int]:
    """This rank's parameter + gradient + optimizer-state bytes of the MoE layers' experts
    (routed and shared) and routers, read off the same tensors as `state_bytes` (`twin` holds
    the state of `optimizer`'s parameters' local shards, in the same order); {} for a dense
    model."""
    from models.moe import moe_layers

    local = {
        id(p): t
        for group, twin_group in zip(optimizer.param_groups, twin.param_groups)
        for p, t in zip(group["params"], twin_group["params"])
    }
    parts: dict[str, list[torch.nn.Parameter]] = {"experts": [], "router": []}
    for _, layer in moe_layers(model):
        experts = [layer.experts, layer.shared_experts]
        parts["experts"] += [p for m in experts if m is not None for p in m.parameters()]
        parts["router"] += list(layer.router.parameters())
    if not parts["experts"]:
        return {}
    result = {}
    for name, params in parts.items():
        state = [v for p in params for v in twin.state[local[id(p)]].values()]
        grads = [p.grad for p in params if p.grad is not None]
        result[name] = sum(
            tensors_bytes(ts)
            for ts in (params, grads, [v for v in state if isinstance(v, torch.Tensor)])
        )
    return result


def fsdp_transient_bytes(
    outer: int, block: int, tp: int, param_bytes: int, reduce_bytes: int
) -> int:
    """What FSDP2 holds unsharded at its peak (the start of backward): the largest unit outside
    the blocks, `outer` parameters (for Llama the final norm + head, kept after forward; the
    embedding, its own unit, is gathered again only at the end of backward), two blocks'
    parameters (the last one, kept, and the one prefetched), and the largest unsharded gradient
    awaiting its reduce-scatter, in the compute dtype and its copy in the reduce dtype."""
    return int(
        (outer + 2 * block) * param_bytes / tp
        + max(outer, block) * (param_bytes + reduce_bytes) / tp
    )


def _create_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> torch.optim.Optimizer:
    """The state a first optimizer step creates, on meta tensors.

    DTensor optimizer state is sharded exactly like its parameter, so a twin of the optimizer
    steps over each parameter's local shard (routing ~300 meta steps through DTensor's sharding
    propagation would cost tens of seconds). The fused kernels refuse meta tensors; the foreach
    implementation creates the same state tensors (shapes, dtypes)."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    groups = []
    for g in optimizer.param_groups:
        local = [
            (p.to_local() if isinstance(p, DTensor) else p).detach().requires_grad_()
            for p in g["params"]
        ]
        for t in local:
            t.grad = torch.zeros_like(t)
        groups.append(
            {
                **{k: v for k, v in g.items() if k != "params"},
                "params": local,
                "fused": False,
                "foreach": True,
            }
        )
    twin = type(optimizer)(groups)  # type: ignore[call-arg]  # AdamW/Adam: defaults optional
    twin.step()
    return twin


@dataclass
class Plan:
    world_size: int
    rank: int
    mesh: dict[str, int]
    model: str
    n_params: int
    dp_size: int
    tp: int
    grad_accum_steps: int
    tokens_per_step: int
    flops_per_step: float
    device_memory: int
    bytes: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    float8: str | None = None  # the float8 conversion plan, when float8 is on
    pipeline: str = ""  # the stage split, micro-batches and bubble, under pipeline parallel
    cp: int = 1  # context-parallel degree: ranks that share each sequence
    tokens_per_rank: int = 0  # tokens of a micro-batch this rank holds (seq / cp of each sequence)
    context_parallel: str = ""  # how the sequence is cut, under context parallel
    memory_budget: str = ""  # the budget and what the plan assumes, under AC by memory budget
    # Left for what the plan does not count (the CUDA context, NCCL's buffers): FITS means
    # total <= device_memory - headroom.
    headroom: int = 0
    headroom_note: str = ""  # what the headroom is made of, when the plan estimated it
    warnings: list[str] = field(default_factory=list)  # one line each, for stderr
    # An MoE's share of the rows above, by part (not added to the total again); {} if dense.
    moe: dict[str, int] = field(default_factory=dict)
    moe_note: str = ""  # the MoE's shape, the heading of those rows
    all_to_all: AllToAllPlan | None = None  # under expert parallel
    active_params: int = 0  # the parameters a token runs through (an MoE's FLOPs count these)
    evaluation: str = ""  # the [eval] forwards per evaluation and their cost, when eval is on

    @property
    def total(self) -> int:
        return sum(self.bytes.values())

    @property
    def fits(self) -> bool:
        return self.total <= self.device_memory - self.headroom

    def _activated(self) -> str:
        if self.active_params == self.n_params:
            return ""
        return (
            f" (an MoE: counted on the {self.active_params / 1e9:.2f}B parameters a token"
            " activates, as its MFU)"
        )

    def render(self) -> str:
        mesh = " x ".join(f"{k}={v}" for k, v in self.mesh.items())
        lines = [
            f"dry run: {self.model}, {self.n_params / 1e9:.2f}B parameters, world {self.world_size}"
            f" (rank {self.rank} shown), planned in {self.seconds:.1f}s",
            f"  mesh                 {mesh}",
            f"  data parallel        {self.dp_size} ranks, {self.grad_accum_steps} micro-batch(es) per step",
            f"  tokens per step      {self.tokens_per_step:,}",
        ]
        if self.context_parallel:
            lines.append("  " + self.context_parallel)
        lines += [
            f"  FLOPs per step       {self.flops_per_step:.3e}{self._activated()}",
        ]
        if self.evaluation:
            lines.append("  " + self.evaluation)
        if self.memory_budget:
            lines.append("  " + self.memory_budget)
        if self.float8:
            lines += ["  " + line for line in self.float8.splitlines()]
        if self.pipeline:
            lines += ["  " + line for line in self.pipeline.splitlines()]
        lines.append("  memory per rank:")
        for name, value in sorted(self.bytes.items(), key=lambda kv: -kv[1]):
            lines.append(f"    {name:<36} {value / GIB:9.2f} GiB")
        verdict = "FITS" if self.fits else "DOES NOT FIT"
        usable, device, headroom = (
            f"{round(b / GIB, 1):g}"
            for b in (self.device_memory - self.headroom, self.device_memory, self.headroom)
        )
        lines.append(
            f"    {'total':<36} {self.total / GIB:9.2f} GiB of {usable} GiB usable"
            f" ({device} GiB device - {headroom} GiB headroom)  -> {verdict}"
        )
        if self.headroom_note:
            lines.append("    " + self.headroom_note)
        if self.moe:
            lines.append(f"  of which Mixture of Experts ({self.moe_note}; included above):")
            lines += [f"    {name:<36} {value / GIB:9.2f} GiB" for name, value in self.moe.items()]
        if self.all_to_all is not None:
            room = self.device_memory - self.headroom
            lines.append("  " + self.all_to_all.describe(self.total, room))
        if not self.fits:
            top = max(self.bytes, key=lambda name: self.bytes[name])
            remedy = (
                "--parallelism.fsdp_sync_grads_each_microbatch true removes it"
                if top == KEPT_GRADS
                else "more data-parallel shards, tensor or context parallel, activation "
                "checkpointing or a smaller local batch reduce it"
            )
            lines.append(f"  biggest item: {top}; {remedy}")
        return "\n".join(lines)


def plan(
    job: JobConfig,
    world_size: int,
    rank: int = 0,
    device_memory_gib: float = 80.0,
    device_type: str = "cuda",
    vocab_size: int | None = None,
    headroom_gib: float | None = None,
) -> Plan:
    """Build everything a real launch builds, on meta tensors, for `rank` of `world_size`.
    The vocabulary comes from the tokenizer when its file is here, else `vocab_size` (default:
    the family's, e.g. Llama 3's 128,256). `headroom_gib`: what the verdict keeps free; by
    default the CUDA context and this rank's NCCL communicators (titanlite/planning/headroom.py)."""
    start = time.perf_counter()
    pre, built, sizes, moe_states, n_comms = _build_on_meta(
        job, world_size, rank, device_type, vocab_size
    )
    kept = headroom(device_type, n_comms)
    dims, t = pre.dims, job.training
    act, pipeline, batch = _activations(job, pre, built, rank, device_type)
    unsharded = _fsdp_unsharded(job, pre, built)
    if unsharded is not None:
        sizes["FSDP unsharded params/grads"] = unsharded
    warnings = []
    if keeps_unsharded_grads(job, pre.dims, pre.grad_accum_steps):
        sizes[KEPT_GRADS] = _kept_unsharded_grads(built)
        warnings.append(warning_line(job, pre.grad_accum_steps, sizes[KEPT_GRADS]))
    elif dims.pp_enabled and dims.fsdp_enabled:
        # torch's pipeline stages run every backward with the sync off and reduce-scatter once
        # after the last (PipelineStage.perform_reduce_grad): the same gradients, whatever
        # the option and the number of micro-batches.
        sizes[KEPT_GRADS] = _kept_unsharded_grads(built)
    sizes["activations (saved)"] = act.blocks + act.outside
    sizes["activations (recompute + loss grad)"] = act.recompute + act.loss_backward
    tokens = t.local_batch_size * t.seq_len * dims.dp_size * pre.grad_accum_steps
    per_rank = batch * t.seq_len // dims.cp
    context_parallel, memory_budget = _notes(job, pre, built, batch)
    moe, moe_note = _moe_rows(pre.model_args, moe_states, act, dims.ep)
    all_to_all = None
    if dims.ep_enabled:
        args = cast(Any, pre.model_args)  # an MoE family's: expert parallel needs one
        all_to_all = all_to_all_plan(
            args.moe,
            args.dim,
            built.options.param_dtype.itemsize,
            tokens=per_rank // dims.tp,
            ep=dims.ep,
            efsdp=dims.efsdp,
        )
        sizes["all-to-all buffers (EP, balanced)"] = all_to_all.balanced
    spec = built.family.model
    flops = float(spec.training_flops_per_token(pre.model_args, t.seq_len) * tokens)
    return Plan(
        world_size=world_size,
        rank=rank,
        mesh=dict(zip(*reversed(dims.mesh_shape()))),
        model=f"{job.model.name} {job.model.flavor}",
        n_params=spec.num_params(pre.model_args),
        dp_size=dims.dp_size,
        tp=dims.tp,
        grad_accum_steps=pre.grad_accum_steps,
        tokens_per_step=tokens,
        flops_per_step=flops,
        device_memory=int(device_memory_gib * GIB),
        headroom=kept.bytes if headroom_gib is None else int(headroom_gib * GIB),
        headroom_note=kept.describe() if headroom_gib is None else "",
        bytes=sizes,
        seconds=time.perf_counter() - start,
        float8=built.float8_plan.describe() if built.float8_plan is not None else None,
        pipeline=pipeline,
        cp=dims.cp,
        tokens_per_rank=per_rank,
        context_parallel=context_parallel,
        memory_budget=memory_budget,
        warnings=warnings,
        moe=moe,
        moe_note=moe_note,
        all_to_all=all_to_all,
        active_params=_active_params(spec, pre.model_args),
        evaluation=eval_cost(job, dims.dp_size, pre.grad_accum_steps, flops),
    )


def _active_params(spec, args) -> int:
    if getattr(args, "moe", None) is None:
        return spec.num_params(args)
    return spec.num_params(args, active_only=True)


MOE_ACTIVATIONS = {  # models/estimate.py's parts -> the plan's rows
    "dispatch": "dispatch buffers (token copies)",
    "grouped GEMMs": "grouped-GEMM activations",
    "router": "router activations",
    "shared experts": "shared-expert activations",
}


def _moe_rows(
    args, states: dict[str, int], act: ActivationEstimate, ep: int
) -> tuple[dict[str, int], str]:
    """The MoE rows (what the state and activation rows hold of its parts) and their heading."""
    moe = getattr(args, "moe", None)
    if moe is None or not states:
        return {}, ""
    rows = {
        "expert weights + grads + optimizer": states["experts"],
        "router weights + grads + optimizer": states["router"],
    }
    for part, (blocks, recompute) in act.moe.items():
        rows[MOE_ACTIVATIONS[part]] = blocks + recompute
    split = f"EP {ep}, {moe.num_experts // ep} per rank" if ep > 1 else "no expert parallel"
    return rows, f"{moe.num_experts} experts, {moe.top_k} per token, {split}"


def _notes(job: JobConfig, pre: Preflight, built: BuiltModel, batch: int) -> tuple[str, str]:
    """The plan's context-parallel and memory-budget lines ("" when off)."""
    dims, opts, seq = pre.dims, built.options, job.training.seq_len
    context_parallel = memory_budget = ""
    if dims.cp_enabled:
        context_parallel = (
            f"context parallel     {dims.cp} ranks share each sequence "
            f"({job.parallelism.context_parallel_load_balancer} cut): {batch * seq // dims.cp:,} "
            f"tokens per rank of the micro-batch's {batch * seq:,}"
        )
    if opts.ac_mode == "memory_budget":
        memory_budget = (
            f"activation memory    budget {opts.ac_memory_budget:g} (compiled min-cut): each "
            f"block planned to keep its input and {opts.ac_memory_budget:g} of its other "
            "activations (an upper bound)"
        )
    return context_parallel, memory_budget


def _build_on_meta(
    job: JobConfig, world_size: int, rank: int, device_type: str, vocab_size: int | None
) -> tuple[Preflight, BuiltModel, dict[str, int], dict[str, int], int]:
    """(the preflight record, the built model, its per-rank state bytes, those of its MoE
    experts and routers, the rank's NCCL communicators): the checks, model, parallelization and
    optimizer of a real launch, on meta tensors under a fake process group."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from titanlite.build import assemble as build
    from titanlite.data import TokenizerError, resolve_tokenizer_path
    from titanlite.families import get_family
    from titanlite.preflight import checks as preflight

    if vocab_size is None:
        try:
            resolve_tokenizer_path(job.model.tokenizer_path)
        except TokenizerError:
            vocab_size = get_family(job.model.name).estimator.default_vocab_size
    pre = preflight.check(job, world_size, device=device_type, vocab_size=vocab_size)
    if dist.is_initialized():
        raise RuntimeError("plan() needs a process without a process group (it makes a fake one)")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        dims = pre.dims
        built = build.build_model(job, dims, pre.model_args, dims.build_meshes("cpu"), device_type)
        optimizer = build.build_optimizer(job, built)
        twin = _create_optimizer_state(built.model, optimizer)
        sizes = state_bytes(built.model, twin)
        moe_states = moe_state_bytes(built.model, optimizer, twin)
        sizes["buffers (RoPE table)"] = tensors_bytes(built.model.buffers())
        n_comms = communicators()
    finally:
        dist.destroy_process_group()
    return pre, built, sizes, moe_states, n_comms


def _activations(
    job: JobConfig, pre: Preflight, built: BuiltModel, rank: int, device_type: str
) -> tuple[ActivationEstimate, str, int]:
    """(this rank's activations, the pipeline summary, sequences per micro-batch)."""
    dims, opts, t = pre.dims, built.options, job.training
    pipeline = ""
    in_flight, batch, blocks_held, has_output = 1, t.local_batch_size, None, True
    if dims.pp_enabled:
        in_flight, exact, batch, blocks_held, has_output = _pipeline_share(job, built, dims, rank)
        pipeline = built.pipeline_summary + (
            f"\n  in flight            {in_flight} (micro-batch, stage) forwards at the peak"
            + ("" if exact else " (upper bound: this schedule's peak is not modeled)")
        )
    act = estimate_activations(
        pre.model_args,
        local_batch_size=batch,
        seq_len=t.seq_len,
        tp=dims.tp,
        loss_parallel=opts.loss_parallel,
        ac_mode=opts.ac_mode,
        ac_option=opts.ac_option,
        memory_budget=opts.ac_memory_budget,
        compute_bytes=opts.param_dtype.itemsize,
        blocks_held=blocks_held,
        has_output=has_output,
        cp=dims.cp,
        family=built.family,
        device_type=device_type,
    )
    if in_flight > 1:
        moe = {part: (b * in_flight, r) for part, (b, r) in act.moe.items()}
        act = replace(act, blocks=act.blocks * in_flight, outside=act.outside * in_flight, moe=moe)
    return act, pipeline, batch


def _fsdp_unsharded(job: JobConfig, pre: Preflight, built: BuiltModel) -> int | None:
    """What FSDP holds unsharded at its peak; None without FSDP."""
    dims, opts = pre.dims, built.options
    compute_bytes, args = opts.param_dtype.itemsize, pre.model_args
    if not dims.fsdp_enabled:
        return None
    if dims.pp_enabled and job.parallelism.fsdp_reshard_after_forward != "always":
        # A stage's gathered parameters stay until the step's last backward (the family's
        # parallelize does not reshard under pipeline parallel): all of them, plus the newest
        # gradient in the compute dtype before FSDP casts it into the kept ones (KEPT_GRADS).
        numels = [gathered_numel(p) for p in built.model.parameters()]
        return int((sum(numels) + max(numels)) * compute_bytes)
    blocks = list(cast(torch.nn.ModuleDict, built.model.layers).values())
    block = sum(gathered_numel(p) for p in blocks[0].parameters()) if blocks else 0
    return fsdp_transient_bytes(
        built.family.estimator.fsdp_outer_unit_params(args),
        block * dims.tp,  # in whole-model elements, as the outer unit's
        dims.tp,
        compute_bytes,
        opts.reduce_dtype.itemsize,
    )


def gathered_numel(p: torch.Tensor) -> int:
    """Elements of `p` that FSDP all-gathers on this rank: the whole parameter, less a
    tensor-parallel or expert-parallel split (an MoE's experts, replicated over tp, are gathered
    whole on every tp rank, parallelisms/moe_tp.py; split over ep, each rank gathers its own)."""
    if not isinstance(p, DTensor):
        return p.numel()
    names = p.device_mesh.mesh_dim_names or ()
    split = 1
    for i, (name, placement) in enumerate(zip(names, p.placements)):
        if name in ("tp", "ep") and placement.is_shard():
            split *= p.device_mesh.size(i)
    return p.numel() // split


def _kept_unsharded_grads(built: BuiltModel) -> int:
    """Every FSDP unit's unsharded gradients in the reduce dtype, which FSDP2 keeps between
    micro-batches when it reduce-scatters on the last one only (titanlite/preflight/memory.py
    gives torch's code path; tests/distributed/test_kept_grads.py measures it)."""
    from parallelisms.fsdp import unsharded_numels

    return sum(unsharded_numels(built.model)) * built.options.reduce_dtype.itemsize


def _pipeline_share(job: JobConfig, built, dims, rank: int) -> tuple[int, bool, int, int, bool]:
    """For `rank`'s pipeline stages: (micro-batch forwards in flight at the peak, whether that is
    exact, sequences per micro-batch, blocks per local stage on average, holds the output)."""
    from parallelisms.pipeline import microbatches_in_flight

    p = job.parallelism
    per_rank = len(built.stage_ids)
    n_mb = job.training.local_batch_size // p.pipeline_parallel_microbatch_size
    pp_rank = rank // (dims.world_size // dims.pp)  # pp is the outermost mesh dim
    in_flight, exact = microbatches_in_flight(
        p.pipeline_parallel_schedule, dims.pp, pp_rank, per_rank, n_mb
    )
    blocks = sum(len(built.stage_layers[i]) for i in built.stage_ids) // per_rank
    has_output = built.num_stages - 1 in built.stage_ids
    return in_flight, exact, p.pipeline_parallel_microbatch_size, blocks, has_output


def split_dry_run_args(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """Pull `--dry-run` and `--dry-run.KEY VALUE` / `--dry-run.KEY=VALUE` out of argv."""
    opts, rest, i = {}, [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--dry-run":
            i += 1
            continue
        if arg.startswith("--dry-run."):
            key, eq, value = arg[len("--dry-run.") :].partition("=")
            if not eq:
                if i + 1 >= len(argv):
                    raise config_lib.ConfigError(f"command line: {arg} needs a value")
                value, i = argv[i + 1], i + 1
            opts[key] = value
        else:
            rest.append(arg)
        i += 1
    return opts, rest


def _read_options(opts: dict[str, str]) -> tuple[int, int, float, float | None, int | None]:
    """The --dry-run options (and NGPU x NNODES, the world size run_train.sh would launch), each
    a number within its range; NumberError naming the option otherwise."""
    ngpu = read_int(os.environ.get("NGPU", "1"), "NGPU", 1, WORLD_MAX)
    nnodes = read_int(os.environ.get("NNODES", "1"), "NNODES", 1, WORLD_MAX)
    world = read_int(opts.get("world_size", ngpu * nnodes), "--dry-run.world_size", 1, WORLD_MAX)
    rank = read_int(opts.get("rank", 0), "--dry-run.rank", 0, WORLD_MAX - 1)
    memory = read_float(
        opts.get("device_memory_gib", 80), "--dry-run.device_memory_gib", 0.001, 2**20
    )
    headroom = None
    if "headroom_gib" in opts:
        headroom = read_float(opts["headroom_gib"], "--dry-run.headroom_gib", 0, 2**20)
    vocab = None
    if "vocab_size" in opts:
        vocab = read_int(opts["vocab_size"], "--dry-run.vocab_size", 1, VOCAB_MAX)
    return world, rank, memory, headroom, vocab


def main(argv: list[str] | None = None) -> int:
    from titanlite.preflight import checks as preflight

    argv = sys.argv[1:] if argv is None else argv
    try:
        opts, rest = split_dry_run_args(argv)
        known = {
            "world_size",
            "rank",
            "device_memory_gib",
            "headroom_gib",
            "device_type",
            "vocab_size",
        }
        if set(opts) - known:
            raise config_lib.ConfigError(
                f"command line: unknown --dry-run.{sorted(set(opts) - known)[0]}; known: "
                f"{', '.join(sorted(known))}"
            )
        world, rank, memory, headroom, vocab = _read_options(opts)
        if headroom is not None and not 0 <= headroom < memory:
            raise config_lib.ConfigError(
                f"--dry-run.headroom_gib {headroom:g} must be >= 0 and below "
                f"--dry-run.device_memory_gib {memory:g}"
            )
        if not 0 <= rank < world:
            raise config_lib.ConfigError(f"--dry-run.rank {rank} is outside world size {world}")
        job = config_lib.load(rest)
        device_type = opts.get("device_type", "cuda")
        result = plan(job, world, rank, memory, device_type, vocab, headroom)
        stages = []
        pp = job.parallelism.pipeline_parallel_degree
        if pp > 1 and "rank" not in opts:
            # Stages differ (the first holds the embedding and the most micro-batches in
            # flight, the last the output and the loss): one plan per stage.
            stages = [
                plan(job, world, r, memory, device_type, vocab, headroom)
                for r in range(0, world, world // pp)
            ]
    except preflight.user_errors() as e:
        return report(e)
    print(result.render())
    for line in result.warnings:
        print(line, file=sys.stderr)
    if stages:
        print(stage_table(stages))
    windows = job.training.local_batch_size * result.dp_size * result.grad_accum_steps
    mixture = mixture_plan(job, windows)
    if mixture:
        text, refusal = mixture
        print(text)
        if refusal:  # the whole plan first, then the verdict training's preflight would give
            return report(refusal)
    return 0


def stage_table(plans: list[Plan]) -> str:
    """One line per pipeline stage (its first rank): what differs between stages."""
    lines = ["  per pipeline stage (GiB):", "    rank  params+grads+optim  activations  total"]
    for p in plans:
        b = p.bytes
        state = b["parameters"] + b["gradients"] + b["optimizer"]
        act = b["activations (saved)"] + b["activations (recompute + loss grad)"]
        verdict = "FITS" if p.fits else "DOES NOT FIT"
        lines.append(
            f"    {p.rank:4d}  {state / GIB:18.2f}  {act / GIB:11.2f}  {p.total / GIB:5.2f}  {verdict}"
        )
    return "\n".join(lines)
