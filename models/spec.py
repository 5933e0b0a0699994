"""What the rest of titanlite needs to know about a model family, without any parallel code."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any, Protocol, cast

import torch


class ModelArgs(Protocol):
    """What the rest of titanlite reads of a family's hyper-parameters (a frozen dataclass)."""

    @property
    def n_layers(self) -> int: ...  # the pipeline splits blocks over stages

    @property
    def vocab_size(self) -> int: ...  # the embedding's and the output's rows (from the tokenizer)

    @property
    def max_seq_len(self) -> int: ...  # the longest sequence the positions cover

    @property
    def bos_id(self) -> int: ...  # the token that starts a document (block_causal's masks)

    @property
    def n_heads(self) -> int: ...  # tensor and context parallel split the heads

    @property
    def kv_heads(self) -> int: ...  # key/value heads, n_heads without grouped-query attention

    def to_dict(self) -> dict[str, object]: ...  # what a checkpoint's manifest records

    def check(self) -> None: ...  # ValueError naming the first shape constraint broken


class ArgsRecord:
    """What every family's frozen args dataclass does alike: its manifest record, read back
    (unknown fields named), and overrides where they are not None."""

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-able data (what a checkpoint's manifest records)."""
        return {f.name: getattr(self, f.name) for f in fields(cast(Any, self))}

    @classmethod
    def from_dict(cls, d: dict) -> Any:
        unknown = sorted(set(d) - {f.name for f in fields(cast(Any, cls))})
        if unknown:
            raise ValueError(f"unknown model argument(s) {', '.join(unknown)}")
        return cls(**d)

    def with_overrides(self, **overrides: Any) -> Any:
        return replace(cast(Any, self), **{k: v for k, v in overrides.items() if v is not None})


class TrainableModel(Protocol):
    """What the trainer calls on a family's model besides nn.Module's own methods."""

    def init_weights(self, seed: int, buffer_device: torch.device | None = None) -> None: ...


@dataclass(frozen=True)
class ModelSpec:
    name: str
    flavors: dict[str, Any]  # flavor name -> the family's args dataclass
    model_cls: type
    num_params: Callable[..., int]
    training_flops_per_token: Callable[[Any, int], int]


# ---------------------------------------------------------------------------------------------
# the dry run's formulas


@dataclass(frozen=True)
class ActivationTerms:
    """Bytes of activations one rank keeps for one micro-batch, by where they live (floats: the
    dry run adds them up before rounding)."""

    full_block: float  # one block without checkpointing
    block_input: float  # a block's input (all that full checkpointing keeps of it)
    op_block: float  # what selective op checkpointing keeps of one block
    outside: float  # after the last block: final norm, logits and loss (the last stage's)
    shared: float  # built once per forward, read by every block (every stage holds it)
    loss_backward: float  # the loss's transient gradients in backward (the last stage's)
    # An MoE block's share of full_block and op_block, by part ("router", "dispatch", ...):
    # {part: (bytes without checkpointing, bytes selective op checkpointing keeps)}; {} if dense.
    moe: dict[str, tuple[float, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class Estimator:
    """A family's formulas for the dry run: pure arithmetic on its args and the parallel degrees
    (plain ints), so that titanlite.planning stays generic."""

    # (args, *, local_batch_size, seq_len, tp, cp, loss_parallel, compute_bytes, device_type)
    # -> terms
    activations: Callable[..., ActivationTerms]
    # Parameters of the larger FSDP unit outside the blocks (for Llama the final norm + head;
    # the embedding is the other): unsharded at the start of backward.
    fsdp_outer_unit_params: Callable[[Any], int]
    # The vocabulary a dry run assumes when the tokenizer is not on this machine.
    default_vocab_size: int


# ---------------------------------------------------------------------------------------------
# Hugging Face interop


class HFConfigError(ValueError):
    """An HF config that the family cannot represent; the message names the field."""


def _one_tensor_each(key: str, args: Any) -> tuple[str, ...] | None:
    return None


@dataclass(frozen=True)
class HFAdapter:
    """A family's Hugging Face state-dict adapter: parameter names and values both ways and
    config.json <-> args. Pure functions of names, tensors, dicts and the family's args; the
    files (DCP, safetensors) are titanlite.components.checkpoint.hf's business."""

    label: str  # the family in messages ("a Llama model")
    model_types: tuple[str, ...]  # config.json `model_type`s it reads
    embedding_key: str  # the titanlite parameter whose first dimension is the vocabulary
    shape_fields: tuple[str, ...]  # args compared against a configured model
    ignored: re.Pattern[str]  # HF tensors that are never loaded (derived buffers)
    describe: Callable[[Any], str]  # args -> "dim 256, 6 layers, ..."
    state_dict_shapes: Callable[[Any], dict[str, tuple[int, ...]]]  # titanlite key -> shape
    to_hf_name: Callable[[str], str]
    # (titanlite key, tie_word_embeddings) -> the HF tensor the parameter is read from
    source_name: Callable[[str, bool], str]
    to_hf_tensor: Callable[[str, torch.Tensor, Any], torch.Tensor]
    # (key, HF rows, args) -> titanlite rows: the whole tensor, or rows [a*g, b*g) of it for
    # g = row_group(key, args) (a conversion moves rows only within such a group)
    from_hf_tensor: Callable[[str, torch.Tensor, Any], torch.Tensor]
    row_group: Callable[[str, Any], int]
    # (args, *, dtype, max_position_embeddings, bos_token_id, eos_token_id) -> config.json
    hf_config: Callable[..., dict[str, Any]]
    args_from_hf_config: Callable[[dict[str, Any]], Any]  # HFConfigError names the field
    # (key, args) -> None for a key that is one HF tensor (to_hf_name / source_name); else the
    # names of the HF tensors it is made of, in order, each row (dim 0) of the titanlite tensor
    # being the next len(names) / rows of them concatenated on their dim 0 (an MoE's experts:
    # the hub files hold one tensor per expert and projection); () for a titanlite-only key
    # (exported nowhere, zeros on import)
    split_names: Callable[[str, Any], tuple[str, ...] | None] = _one_tensor_each
    # (args from config.json, the folder's tensor names) -> the args of the model the folder
    # holds, where config.json can claim parts its writer did not save (transformers'
    # DeepseekV3Config counts an MTP module that its save_pretrained never writes); None: the
    # config's args
    fit_tensors: Callable[[Any, set[str]], Any] | None = None
    # args -> the args of the model without the modules only training runs (DeepSeek-V3's
    # MTP): what an export writes unless asked for them; None: the family has none
    inference_args: Callable[[Any], Any] | None = None
