"""Activation memory of a training step, per rank: the family's terms (its estimator in the
family record, e.g. models/llama/estimate.py, which documents and calibrates its formula)
combined with the activation-checkpointing mode and the share of a pipeline stage.

Activation checkpointing changes what each block keeps until backward:
- none: everything;
- full: only the block input, plus one block's activations while it is recomputed;
- selective N: blocks 0, N, 2N, ... as with full, the others as with none;
- selective op: what the family's op policy keeps of each block (for Llama: the block input,
  every second matmul output, the SDPA output and log-sum-exp), plus one block's recompute.
- memory_budget b (compiled blocks): the block input plus b of the rest of `none`'s block, and
  (1 - b) of one block's activations while they are recomputed; b = 0 is `full`, b = 1 `none`.
  Linear in b, and an upper bound as measured: torch's min-cut partitioner keeps at most b of the
  way from the graph's inputs (what b = 0 keeps: the block input) to what it keeps at b = 1,
  which is well below eager `none` (compile recomputes pointwise ops such as the norms and SiLU
  anyway). On the test model (2 blocks, dim 64, fp32, 2 x 64 tokens) the blocks kept 64, 642 and
  1222 KiB at b = 0, 0.5, 1 against the formula's 64, 803 and 1542 KiB; eager no AC kept 1606
  KiB, so compile's saving (24%) outweighs the formula's under-count of eager (4%)
  (tests/unit/parallelisms/test_activation_checkpoint.py).
An MoE's parts (router, dispatch buffers, grouped-GEMM activations; models/estimate.py) go
through the same modes on their own, so that the plan can show what its rows hold of each.
Outside the blocks: what follows the last block (final norm, logits, loss) on the last stage
only, and what the model builds once per forward for every block (masks, RoPE rows) on every
stage, whatever the checkpointing mode.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from models import ModelArgs
from models.spec import ActivationTerms
from titanlite.families import ModelFamily, family_of_args


@dataclass(frozen=True)
class ActivationEstimate:
    per_block_full: int  # bytes one block keeps without checkpointing (whole micro-batch)
    blocks: int  # bytes all blocks keep until backward
    recompute: int  # one block's activations rebuilt during backward (AC only)
    outside: int  # final norm, logits/loss
    loss_backward: int  # transient gradient of the logits
    # What `blocks` and `recompute` hold of an MoE's parts: {part: (in blocks, in recompute)}.
    moe: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.blocks + self.recompute + self.outside + self.loss_backward


def checkpointed_blocks(
    terms: ActivationTerms, layers: int, ac_mode: str, ac_option: str, memory_budget: float
) -> tuple[float, float]:
    """(what `layers` blocks keep until backward, one block's recompute) under the mode."""
    full_block, block_input = terms.full_block, terms.block_input
    if ac_mode == "none":
        return layers * full_block, 0.0
    if ac_mode == "full":
        return layers * block_input, full_block
    if ac_mode == "memory_budget":
        b = memory_budget
        return layers * (block_input + b * (full_block - block_input)), (1 - b) * full_block
    if ac_option == "op":
        return layers * terms.op_block, full_block
    wrapped = len(range(0, layers, int(ac_option)))
    blocks = wrapped * block_input + (layers - wrapped) * full_block
    return blocks, full_block if wrapped else 0.0


def estimate_activations(
    args: ModelArgs,
    *,
    local_batch_size: int,
    seq_len: int,
    tp: int,
    loss_parallel: bool,
    ac_mode: str,
    ac_option: str,
    compute_bytes: int,
    blocks_held: int | None = None,
    has_output: bool = True,
    cp: int = 1,
    memory_budget: float = 1.0,
    family: ModelFamily | None = None,
    device_type: str = "cuda",
) -> ActivationEstimate:
    """`blocks_held` and `has_output` describe a pipeline stage (default: the whole model);
    `cp` is the context-parallel degree (`seq_len` stays the whole sequence); `memory_budget`
    is read under `ac_mode` "memory_budget"; `family` defaults to the one whose args `args` are;
    `device_type` is where the kernels run (it picks the attention kernel)."""
    family = family or family_of_args(args)
    terms = family.estimator.activations(
        args,
        local_batch_size=local_batch_size,
        seq_len=seq_len,
        tp=tp,
        cp=cp,
        loss_parallel=loss_parallel,
        compute_bytes=compute_bytes,
        device_type=device_type,
    )
    layers = args.n_layers if blocks_held is None else blocks_held
    blocks, recompute = checkpointed_blocks(terms, layers, ac_mode, ac_option, memory_budget)
    if has_output:
        outside, loss_backward = terms.outside + terms.shared, terms.loss_backward
    else:  # a pipeline stage before the last: no final norm, logits or loss
        outside, loss_backward = terms.shared, 0
    moe = {}
    for part, (full, kept) in terms.moe.items():
        held, rebuilt = checkpointed_blocks(
            _only(full, kept), layers, ac_mode, ac_option, memory_budget
        )
        moe[part] = (int(held), int(rebuilt))
    return ActivationEstimate(
        int(terms.full_block), int(blocks), int(recompute), int(outside), int(loss_backward), moe
    )


def _only(full: float, kept: float) -> ActivationTerms:
    """Terms of a block made of one part (`full` bytes, `kept` of them under selective op
    checkpointing), nothing of which is the block's input."""
    return ActivationTerms(full, 0.0, kept, 0.0, 0.0, 0.0)
