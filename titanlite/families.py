"""The one registry of model families: `model.name` -> the model spec, the function that
parallelizes it, its dry-run formulas and its Hugging Face adapter. It lives here, above both
`models/` (which knows nothing of parallelism) and `parallelisms/` (which knows models only
through their public structure), so that the two halves of a family cannot disagree. A new
family adds one record (docs/architecture.md, "How to add a model family")."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from models import ModelSpec, deepseek_v3, llama, qwen3
from models.spec import Estimator, HFAdapter
from parallelisms import Meshes, ParallelDims, ParallelizeOptions
from parallelisms.float8 import ConversionPlan
from titanlite.config.schema import JobConfig

ParallelizeFn = Callable[
    [nn.Module, ParallelDims, Meshes, ParallelizeOptions], ConversionPlan | None
]
# (meta model, block numbers of every stage, this rank's stage ids) -> one copy per stage.
SplitStagesFn = Callable[[nn.Module, list[list[int]], list[int]], list[nn.Module]]


@dataclass(frozen=True)
class ModelFamily:
    model: ModelSpec
    # In place, in the order float8 -> TP -> AC -> compile -> FSDP/DDP; returns the float8 plan.
    parallelize: ParallelizeFn
    # Pipeline stages: copies keeping their own blocks (and embedding / output at the ends).
    split_stages: SplitStagesFn
    # The dry run's activation and FSDP memory formulas.
    estimator: Estimator
    # The Hugging Face state-dict adapter; None: the family has no Hugging Face mapping.
    hf: HFAdapter | None = None

    @property
    def name(self) -> str:
        return self.model.name

    def args_from_dict(self, d: dict[str, Any]) -> Any:
        """The family's args from what a checkpoint's manifest records (`to_dict`)."""
        return type(next(iter(self.model.flavors.values()))).from_dict(d)


# The parallelize and split functions are imported when a model is built, not when preflight
# reads a flavor: FSDP, DTensor and pipelining take ~1.8 s to import, on every launch.
def _parallelize_llama(
    model: nn.Module, dims: ParallelDims, meshes: Meshes, opts: ParallelizeOptions
) -> ConversionPlan | None:
    from parallelisms.llama import parallelize_llama

    return parallelize_llama(model, dims, meshes, opts)


def _parallelize_qwen3(
    model: nn.Module, dims: ParallelDims, meshes: Meshes, opts: ParallelizeOptions
) -> ConversionPlan | None:
    from parallelisms.qwen3 import parallelize_qwen3

    return parallelize_qwen3(model, dims, meshes, opts)


def _parallelize_deepseek_v3(
    model: nn.Module, dims: ParallelDims, meshes: Meshes, opts: ParallelizeOptions
) -> ConversionPlan | None:
    from parallelisms.deepseek_v3 import parallelize_deepseek_v3

    return parallelize_deepseek_v3(model, dims, meshes, opts)


def _stage_models(model: nn.Module, blocks: list[list[int]], ids: list[int]) -> list[nn.Module]:
    from parallelisms.pipeline import stage_models

    return stage_models(model, blocks, ids)


FAMILIES: dict[str, ModelFamily] = {
    f.name: f
    for f in (
        ModelFamily(llama.SPEC, _parallelize_llama, _stage_models, llama.ESTIMATOR, llama.HF),
        ModelFamily(qwen3.SPEC, _parallelize_qwen3, _stage_models, qwen3.ESTIMATOR, qwen3.HF),
        ModelFamily(
            deepseek_v3.SPEC,
            _parallelize_deepseek_v3,
            _stage_models,
            deepseek_v3.ESTIMATOR,
            deepseek_v3.HF,
        ),
    )
}
# The family of a manifest or config that names none (config/schema.py's default model.name).
DEFAULT_FAMILY = JobConfig().model.name


def get_family(name: str) -> ModelFamily:
    # config_schema restricts model.name to these names, so a miss is a bug, not a user error.
    return FAMILIES[name]


def family_of_args(args: Any) -> ModelFamily:
    """The family whose args dataclass `args` is an instance of."""
    for family in FAMILIES.values():
        if any(type(args) is type(f) for f in family.model.flavors.values()):
            return family
    raise TypeError(f"{type(args).__name__} is no registered family's model args")


def hf_families() -> list[ModelFamily]:
    """The families that have a Hugging Face mapping."""
    return [f for f in FAMILIES.values() if f.hf is not None]


def family_of_hf_config(cfg: dict[str, Any]) -> ModelFamily:
    """The family whose adapter reads config.json's `model_type`; else the default family, whose
    adapter then names what it would need."""
    for family in hf_families():
        assert family.hf is not None
        if cfg.get("model_type") in family.hf.model_types:
            return family
    return get_family(DEFAULT_FAMILY)


# [model] keys that are not a family's hyper-parameters: every family takes them.
_NOT_ARGS = {"name", "flavor", "tokenizer_path", "converters", "print_after_conversion"}


def foreign_model_keys(job: JobConfig) -> list[str]:
    """The [model] keys set away from their default that the family's args have no field for
    (Llama's multiple_of for a Qwen3 model): `model_args` would drop them silently."""
    m, default = job.model, type(job.model)()
    own = {f.name for f in dataclasses.fields(get_family(m.name).model.flavors[m.flavor])}
    return [
        k
        for k, v in vars(m).items()
        if k not in own and k not in _NOT_ARGS and v != getattr(default, k)
    ]


def model_args(job: JobConfig, vocab_size: int, bos_id: int = -1) -> Any:
    """The model's hyper-parameters: the family's flavor with every [model] key that its args
    dataclass also has (None keeps the flavor's value), the tokenizer's vocabulary unless the
    flavor fixes its own (a published model's padded embedding: Qwen3's 151,936 rows for 151,669
    tokens), the tokenizer's BOS id (-1 where only shapes matter) and the training sequence length
    (the RoPE table's size). A family takes the [model] keys that match its own field names, so
    it lists none here."""
    m = job.model
    flavor = get_family(m.name).model.flavors[m.flavor]
    own = {f.name for f in dataclasses.fields(flavor)}
    overrides = {k: v for k, v in vars(m).items() if k in own and v is not None}
    if flavor.vocab_size > 0:
        vocab_size = flavor.vocab_size
    return dataclasses.replace(
        flavor, **overrides, vocab_size=vocab_size, max_seq_len=job.training.seq_len, bos_id=bos_id
    )
