"""One forward/backward per layout, in one process group: every parameter's full gradient is
compared with a plain model's (no parallelism, whole batch) computed in the same processes.

Each layout is built the way the trainer builds it (ParallelDims.build_meshes, the family's
parallelize function from titanlite.families, init_weights, cross_entropy_loss under
loss_context), one after the other, so that process
start-up and imports are paid once per world size. Rank 0 writes {layout: result} as JSON.
"""

from __future__ import annotations

import json
import sys
import traceback
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from trainer_jobs import layout_facts

from models.moe import set_aux_loss_weight

SEED, BATCH, SEQ = 0, 8, 64


@dataclass(frozen=True)
class Layout:
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    microbatches: int = 1
    float8: bool = False
    opts: dict = field(default_factory=dict)  # ParallelizeOptions fields
    pp: int = 1
    schedule: str = "1F1B"
    cp: int = 1
    load_balancer: str = "headtail"
    model: dict = field(default_factory=dict)  # args overrides (the mask and its kernel)
    family: str = "llama3"
    flavor: str = "debugmodel"

    @property
    def world(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.cp * self.tp


def _model_args(overrides: dict, family: str, flavor: str = "debugmodel"):
    from titanlite.data import Tokenizer, resolve_tokenizer_path
    from titanlite.families import get_family

    vocab = Tokenizer(resolve_tokenizer_path("")).vocab_size
    # "auto", as every preset: causal SDPA, and per-piece varlen under context parallel. Two
    # blocks, as the trainer-level tests (helpers.TWO_BLOCKS): the interleaved schedules' four
    # stages then include stages without a block.
    shape = {"vocab_size": vocab, "max_seq_len": SEQ, "attn_type": "auto", "n_layers": 2}
    return get_family(family).model.flavors[flavor].with_overrides(**{**shape, **overrides})


def _float8_options():
    from parallelisms.float8 import Float8Options

    # As titanlite.preflight.float8 builds them on CPU: emulated matmuls, high-precision collectives.
    return Float8Options(emulate=True, float8_collectives=False)


def _batch(args) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    tokens = torch.randint(0, args.vocab_size, (BATCH, SEQ + 1), generator=g)
    tokens[tokens == args.bos_id] = args.bos_id + 1
    if args.attn_mask_type == "block_causal":
        # Documents that start mid-chunk and cross the context-parallel chunk borders (16 tokens
        # at cp 2), of different lengths in different rows.
        for row in range(BATCH):
            tokens[row, [0, 5 + row, 21 + 2 * row, 40 - row]] = args.bos_id
    return tokens[:, :-1], tokens[:, 1:]


def _clean(name: str) -> str:
    return name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")


def reference_grads(
    float8: bool,
    splits: int = 1,
    model: tuple = (),
    family: str = "llama3",
    flavor: str = "debugmodel",
) -> dict[str, torch.Tensor]:
    """One process, no parallelism. With `splits`, the batch is cut as data parallel cuts it and
    the parts' gradients averaged: float8 scales each tensor by its amax, which under data
    parallel is the amax of a rank's part of the batch, so a float8 layout is compared with
    the same float8 model on the same parts (for fp32 this changes nothing)."""
    from parallelisms.float8 import convert_to_float8
    from titanlite.components.loss import cross_entropy_loss
    from titanlite.families import get_family

    args = _model_args(dict(model), family, flavor)
    with torch.device("meta"):
        model = get_family(family).model.model_cls(args)
    if float8:
        convert_to_float8(model, _float8_options())
    model.to_empty(device="cpu")
    model.init_weights(SEED)
    set_aux_loss_weight(model, BATCH)
    inputs, labels = _batch(args)
    for part_in, part_lab in zip(inputs.chunk(splits), labels.chunk(splits)):
        (cross_entropy_loss(model(part_in), part_lab) / splits).backward()
    return {_clean(n): p.grad.detach().clone() for n, p in model.named_parameters()}


def layout_grads(layout: Layout, facts: dict) -> dict[str, torch.Tensor | None]:
    """Every parameter's full gradient under `layout`; `facts` gets what the layout did
    (trainer_jobs.layout_facts)."""
    from parallelisms import ParallelDims, ParallelizeOptions
    from parallelisms.context_parallel import SequenceShards
    from parallelisms.tensor_parallel import loss_context
    from titanlite.components.loss import cross_entropy_loss, local_batch, model_kwargs
    from titanlite.families import get_family

    family = get_family(layout.family)
    args = _model_args(layout.model, layout.family, layout.flavor)
    dims = ParallelDims.resolve(
        layout.dp_replicate, layout.dp_shard, layout.tp, layout.world, layout.pp, layout.cp
    )
    meshes = dims.build_meshes("cpu")
    shards = SequenceShards(meshes.get("cp"), layout.load_balancer) if dims.cp_enabled else None
    opts = ParallelizeOptions(
        loss_parallel=dims.tp_enabled and layout.opts.get("loss_parallel", True),
        float8=_float8_options() if layout.float8 else None,
        sequence_shards=shards,
        **{k: v for k, v in layout.opts.items() if k != "loss_parallel"},
    )
    with torch.device("meta"):
        model = family.model.model_cls(args)
    inputs, labels = _batch(args)
    dp_rank, dp_size = (meshes.dp.get_local_rank(), meshes.dp.size()) if meshes.dp else (0, 1)
    per_rank = BATCH // dp_size
    inputs = inputs[dp_rank * per_rank : (dp_rank + 1) * per_rank]
    labels = labels[dp_rank * per_rank : (dp_rank + 1) * per_rank]
    # Under context parallel: this rank's part of each sequence, the window as `tokens=`; every
    # part holds as many targets, so FSDP's mean over dp x cp of the parts' means is the mean.
    inputs, window, labels = local_batch(shards, inputs, labels)
    if dims.pp_enabled:
        model = _pipeline_backward(
            model, dims, meshes, opts, layout.schedule, inputs, labels, window, family.parallelize
        )
    else:
        family.parallelize(model, dims, meshes, opts)
        model.to_empty(device="cpu")
        model.init_weights(SEED)
        model.train()
        set_aux_loss_weight(model, len(inputs))  # an MoE's aux loss, as the trainer weighs it
        loss_fn = torch.compile(cross_entropy_loss) if opts.compile else cross_entropy_loss
        n = layout.microbatches
        windows = window.chunk(n) if window is not None else [None] * n
        for mb_in, mb_lab, mb_window in zip(inputs.chunk(n), labels.chunk(n), windows):
            with loss_context(opts.loss_parallel):
                loss = loss_fn(model(mb_in, **model_kwargs(mb_window)), mb_lab) / n
                loss.backward()
    facts.update(layout_facts(model, shards))
    grads: dict[str, torch.Tensor | None] = {}
    for name, p in model.named_parameters():
        g = p.grad
        if isinstance(g, DTensor):
            g = g.full_tensor()
        grads[_clean(name)] = None if g is None else g.detach().clone()
    # Pipeline stages hold different parameters: every rank gets every stage's.
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, grads)
    return {k: v for part in everyone for k, v in part.items()}


def _pipeline_backward(model, dims, meshes, opts, schedule, inputs, labels, window, parallelize):
    """Forward and backward through the stages and schedule the trainer builds; returns this
    rank's stages as one module (their parameters under the whole model's names)."""
    from parallelisms.pipeline import (
        ModelParts,
        PipelineOptions,
        build_schedule,
        num_stages,
        split_layers,
        stage_ids,
        stage_models,
    )
    from parallelisms.tensor_parallel import loss_context
    from titanlite.components.loss import cross_entropy_sum

    pipe = PipelineOptions(schedule)
    n_layers = len(model.layers)
    stages = num_stages(dims.pp, n_layers, pipe)
    ids = stage_ids(meshes.pp.get_local_rank(), dims.pp, stages, schedule)
    parts = stage_models(model, split_layers(n_layers, stages, 1, 1), ids)
    for part in parts:
        parallelize(part, dims, meshes, opts)
        part.to_empty(device="cpu")
        part.init_weights(SEED)
        part.train()
    tokens = inputs.numel()  # a sum over this rank's tokens / their number = its part's mean

    def loss_fn(logits, target):
        return cross_entropy_sum(logits, target) / tokens

    runner = build_schedule(
        parts, ids, stages, meshes.pp, torch.device("cpu"), len(inputs), loss_fn, pipe
    )
    args = (inputs,) if 0 in ids else ()
    with loss_context(opts.loss_parallel):  # as the trainer: vocab-sharded logits under TP
        runner.step(
            *args,
            tokens=inputs if window is None else window,
            target=labels,
            losses=[],
            return_outputs=False,
        )
    return ModelParts(parts)


def compare(got: dict, ref: dict[str, torch.Tensor]) -> dict:
    errors, lost = {}, []
    for name, r in ref.items():
        g = got.get(name)
        if g is None or (r.norm() > 0 and g.norm() == 0):
            lost.append(name)
            continue
        errors[name] = ((g.double() - r.double()).norm() / r.double().norm()).item()
    worst = max(errors, key=errors.get) if errors else None
    ranked = sorted(errors.values())
    return {
        "errors": errors,
        "median": ranked[len(ranked) // 2] if ranked else None,
        "lost": lost,
        "unexpected": sorted(set(got) - set(ref)),
        "worst_param": worst,
        "worst": errors[worst] if worst else None,
    }


def run(rank: int, world: int, layouts: dict[str, dict], out: str) -> None:
    import time

    import torch._dynamo

    torch.set_num_threads(1)
    refs: dict[tuple, dict] = {}
    results = {}
    for name, spec in layouts.items():
        layout = Layout(**spec)
        assert layout.world == world, (name, layout.world, world)
        splits = layout.dp_replicate * layout.dp_shard if layout.float8 else 1
        model = tuple(sorted(layout.model.items()))
        key = (layout.float8, splits, model, layout.family, layout.flavor)
        if key not in refs:
            refs[key] = reference_grads(*key)
        torch._dynamo.reset()  # each layout compiles from scratch, as a fresh run would
        torch._dynamo.utils.counters.clear()
        start = time.perf_counter()
        facts: dict = {}
        try:
            result = {**compare(layout_grads(layout, facts), refs[key]), **facts}
        except Exception:
            result = {"error": traceback.format_exc()[-3000:]}
            # Said at once: under pipeline parallel its peers may then wait in a P2P exchange
            # until the test times out, and only rank 0 writes the results.
            print(f"rank {rank}, layout {name}:\n{result['error']}", file=sys.stderr, flush=True)
        if layout.opts.get("compile"):
            # Counted since this layout began (reset() leaves the counters alone): graphs ran.
            result["graphs"] = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        result["seconds"] = round(time.perf_counter() - start, 1)
        results[name] = result
        dist.barrier()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f, indent=1)
