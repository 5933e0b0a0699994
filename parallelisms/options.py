"""The knobs every family's parallelize function takes, gathered from the config sections by
titanlite/build/assemble.py (parallelisms never see the job config)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from parallelisms.context_parallel import SequenceShards
from parallelisms.float8 import Float8Options


@dataclass(frozen=True)
class ParallelizeOptions:
    loss_parallel: bool = True
    async_tp: bool = False
    ac_mode: str = "none"
    ac_option: str = "op"
    ac_memory_budget: float = 1.0  # read under ac_mode "memory_budget" (needs compile)
    compile: bool = False
    param_dtype: torch.dtype = torch.float32
    reduce_dtype: torch.dtype = torch.float32
    reshard_after_forward: str = "default"
    cpu_offload: bool = False
    float8: Float8Options | None = None
    # Context parallel: the cutter the trainer shards batches with and the blocks read positions
    # from (None without cp).
    sequence_shards: SequenceShards | None = None


@dataclass(frozen=True)
class PipelineOptions:
    schedule: str = "1F1B"
    schedule_csv: str = ""
    microbatch_size: int = 1
    layers_per_stage: int | None = None
    first_stage_less_layers: int = 1
    last_stage_less_layers: int = 1
