"""The activation-memory formula's context-parallel terms (titanlite/planning/activation_memory.py): its
relation to the same formula without context parallel, and the bytes torch really saves."""

import dataclasses

import pytest
import torch
import torch.distributed as dist
from helpers import tiny_llama_args

from models.llama import LlamaArgs, Transformer
from titanlite.planning.activation_memory import estimate_activations

ARGS = tiny_llama_args()


def _estimate(args: LlamaArgs, *, seq: int, cp: int, tp: int = 1, ac: str = "none", batch=2):
    mode, option = ("selective", "op") if ac == "op" else (ac, "op")
    return estimate_activations(
        args,
        local_batch_size=batch,
        seq_len=seq,
        tp=tp,
        loss_parallel=True,
        ac_mode=mode,
        ac_option=option,
        compute_bytes=2,
        cp=cp,
    )


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("ac", ["none", "full", "op"])
@pytest.mark.parametrize("kernel", ["sdpa", "varlen"])
def test_cp_2_at_seq_s_is_cp_1_at_s_over_2_plus_the_whole_sequence_attention(ac, tp, kernel):
    # Both hold the same tokens per rank (batch x s/2), so everything token-proportional is
    # equal; context parallel adds, per block, the keys and values of the rest of the sequence
    # the kernel is given, and once per forward the RoPE rows of this rank's positions and,
    # for masked SDPA, the additive (s/2 x s) causal mask; for varlen, the int64 key rows of its
    # pieces: s + s/4 per sequence at cp 2 (rank 0's head piece copies the first s/4 keys, its
    # tail piece all s).
    args = dataclasses.replace(ARGS, attn_mask_type="causal", attn_type=kernel)
    e, s, batch, layers = 2, 4096, 2, args.n_layers
    cp2 = _estimate(args, seq=s, cp=2, tp=tp, ac=ac)
    cp1 = _estimate(args, seq=s // 2, cp=1, tp=tp, ac=ac)
    kv = args.kv_heads * args.head_dim
    rows = s if kernel == "sdpa" else s + s // 4  # key rows per sequence at cp 2
    per_block = batch * (rows - s // 2) * e * 2 * kv / tp
    rope = s // 2 * args.head_dim * 4
    once = rope + (e * s // 2 * s if kernel == "sdpa" else 8 * batch * rows)
    assert cp2.outside - cp1.outside == once and cp2.loss_backward == cp1.loss_backward
    assert cp2.per_block_full - cp1.per_block_full == pytest.approx(per_block, abs=1)
    if ac == "none":
        assert cp2.blocks - cp1.blocks == pytest.approx(layers * per_block, abs=layers)
        assert cp2.recompute == cp1.recompute == 0
    else:  # checkpointed: the blocks keep no attention input; the recompute holds one block's
        assert cp2.blocks == cp1.blocks
        assert cp2.recompute - cp1.recompute == pytest.approx(per_block, abs=1)


def test_block_causal_cp_shrinks_the_tokens_and_the_mask():
    # Masked SDPA: at the same sequence, cp 8 divides every per-token term by 8, and replaces
    # the window's batch x s x s booleans by this rank's rows of the additive mask,
    # e x batch x s/8 x s.
    args = dataclasses.replace(ARGS, attn_mask_type="block_causal", attn_type="sdpa")
    e, s, batch = 2, 8192, 2
    cp8 = _estimate(args, seq=s, cp=8, ac="full", batch=batch)
    cp1 = _estimate(args, seq=s, cp=1, ac="full", batch=batch)
    window = batch * s * s
    rows = e * batch * s // 8 * s + s // 8 * args.head_dim * 4
    assert cp8.blocks * 8 == cp1.blocks
    assert (cp8.outside - rows) * 8 == pytest.approx(cp1.outside - window, rel=1e-9)
    assert cp8.loss_backward * 8 == cp1.loss_backward


def _saved_per_block(args: LlamaArgs, batch: int, seq: int, cp: int) -> int:
    """Bytes autograd saves in one block's forward (each storage once; parameters and the RoPE
    table excluded), on rank 0 of a fake process group of `cp` ranks: the shapes are a real
    run's (measured equal on 2 gloo processes), the all-gathered values are not."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from parallelisms.context_parallel import SequenceShards, apply_cp

    model = Transformer(dataclasses.replace(args, max_seq_len=seq))
    model.init_weights(seed=0)
    tokens = torch.randint(1, args.vocab_size, (batch, seq), generator=torch.Generator())
    tokens[:, ::16] = args.bos_id
    x, kwargs = tokens, {}
    if cp > 1:
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=cp)
        shards = SequenceShards(init_device_mesh("cpu", (cp,), mesh_dim_names=("cp",)), "headtail")
        apply_cp(model, list(model.layers.values()), shards)
        x, kwargs = shards.shard(tokens), {"tokens": tokens}
    skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
    skip.add(model.freqs_cis.untyped_storage().data_ptr())
    saved: dict[int, int] = {}
    in_block = [False]
    block = model.layers["0"]

    def enter(_block, args):
        # The RoPE rows and the mask are made once per forward, before the blocks: the formula
        # counts them outside the blocks.
        for t in torch.utils._pytree.tree_leaves(args[1:]):  # Documents is a tuple
            if isinstance(t, torch.Tensor):
                skip.add(t.untyped_storage().data_ptr())
        in_block[0] = True

    block.register_forward_pre_hook(enter, prepend=True)
    block.register_forward_hook(lambda *_: in_block.__setitem__(0, False))

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if in_block[0] and ptr not in skip:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(x, **kwargs)
    finally:
        if cp > 1:
            dist.destroy_process_group()
    return sum(saved.values())


@pytest.mark.parametrize(
    "kernel, mask",
    [
        ("sdpa", "causal"),
        ("sdpa", "block_causal"),
        ("varlen", "causal"),
        ("varlen", "block_causal"),
    ],
)
def test_cp_terms_match_what_torch_saves(kernel, mask):
    # The formula is not exact for a block (it is calibrated within 25% on the whole step), but
    # what context parallel adds to a block must be: cp 2 at seq 64 against cp 1 at seq 32,
    # the same tokens per rank, in float32 as on CPU. For varlen with documents the formula is
    # the bound (one document per window): documents that end inside a chunk copy fewer keys.
    if dist.is_initialized():
        pytest.skip("needs a process without a process group")
    args = dataclasses.replace(ARGS, attn_mask_type=mask, attn_type=kernel)
    batch, seq = 2, 64
    measured = _saved_per_block(args, batch, seq, 2) - _saved_per_block(args, batch, seq // 2, 1)
    kw = dict(local_batch_size=batch, tp=1, loss_parallel=False, ac_mode="none", ac_option="op")
    formula = (
        estimate_activations(args, seq_len=seq, cp=2, compute_bytes=4, **kw).per_block_full
        - estimate_activations(args, seq_len=seq // 2, cp=1, compute_bytes=4, **kw).per_block_full
    )
    if (kernel, mask) == ("varlen", "block_causal"):
        assert 0 <= measured < formula
    else:
        assert measured > 0 and formula == measured


@pytest.mark.parametrize("tp", [1, 2])
def test_memory_budget_runs_from_full_at_0_to_none_at_1(tp):
    # The budget's bound (titanlite/planning/activation_memory.py, measured in test_memory_budget.py):
    # budget 0 is full AC, 1 is no AC, and the blocks' share moves linearly in between.
    args = dataclasses.replace(ARGS, attn_mask_type="block_causal")

    def estimate(mode: str, budget: float = 1.0):
        return estimate_activations(
            args,
            local_batch_size=2,
            seq_len=512,
            tp=tp,
            loss_parallel=True,
            ac_mode=mode,
            ac_option="op",
            compute_bytes=2,
            memory_budget=budget,
        )

    full, none = estimate("full"), estimate("none")
    assert estimate("memory_budget", 0.0) == full
    assert estimate("memory_budget", 1.0) == none
    quarter = estimate("memory_budget", 0.25)
    assert quarter.blocks == pytest.approx(full.blocks + 0.25 * (none.blocks - full.blocks), abs=1)
    assert quarter.recompute == pytest.approx(0.75 * full.recompute, abs=1)
    assert quarter.outside == full.outside


def test_a_varlen_block_saves_what_a_causal_one_does_and_the_formula_agrees():
    # The per-document kernel keeps q, k, v, its output and log-sum-exp, as causal SDPA does;
    # masked SDPA adds its additive mask. The formula must follow each, not the mask type alone.
    batch, seq = 2, 64
    kw = dict(local_batch_size=batch, tp=1, loss_parallel=False, ac_mode="none", ac_option="op")
    measured, formula = {}, {}
    for kernel, mask in (("sdpa", "causal"), ("varlen", "block_causal"), ("sdpa", "block_causal")):
        args = dataclasses.replace(ARGS, attn_type=kernel, attn_mask_type=mask)
        measured[kernel, mask] = _saved_per_block(args, batch, seq, 1)
        estimate = estimate_activations(args, seq_len=seq, cp=1, compute_bytes=4, **kw)
        formula[kernel, mask] = estimate.per_block_full
    causal, varlen = ("sdpa", "causal"), ("varlen", "block_causal")
    assert measured[varlen] == measured[causal] and formula[varlen] == formula[causal]
    dense = measured["sdpa", "block_causal"] - measured[causal]
    assert dense == batch * seq * seq * 4  # the additive float32 mask SDPA saves
    assert formula["sdpa", "block_causal"] - formula[causal] == dense
