"""The dry run's Mixture-of-Experts activation terms (models/estimate.py, `moe_terms`) are what
autograd saves for backward in an MoE block of the debug Qwen3 MoE model, byte for byte."""

import dataclasses

import pytest
import torch

from models.estimate import block_activations, moe_terms
from models.qwen3 import FLAVORS, Qwen3

BATCH, SEQ = 2, 32


def _saved_in(model: Qwen3, module: torch.nn.Module) -> int:
    """Bytes autograd saves while `module` runs forward (each storage once; parameters and the
    module's input, which the norm before it made and the formula counts there, excluded)."""
    skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
    skip.add(model.freqs_cis.untyped_storage().data_ptr())
    saved: dict[int, int] = {}
    inside = [False]

    def enter(_module, args):
        skip.add(args[0].untyped_storage().data_ptr())
        inside[0] = True

    module.register_forward_pre_hook(enter)
    module.register_forward_hook(lambda *_: inside.__setitem__(0, False))

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if inside[0] and ptr not in skip:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    tokens = torch.randint(0, 512, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(tokens)
    return sum(saved.values())


def _model(dtype: torch.dtype, **overrides) -> Qwen3:
    args = dataclasses.replace(
        FLAVORS["debugmodel_moe"], vocab_size=512, max_seq_len=SEQ, **overrides
    )
    model = Qwen3(args)
    model.init_weights(seed=0)
    return model.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "moe",
    [
        dict(),  # the debug flavor: softmax, renormalized top k, auxiliary loss
        dict(moe_load_balance="expert_bias", moe_norm_topk_prob=False, moe_score_func="sigmoid"),
        dict(moe_shared_hidden_dim=96),
    ],
)
def test_moe_terms_are_what_autograd_saves(dtype, moe):
    model = _model(dtype, **moe)
    measured = _saved_in(model, model.layers["0"].feed_forward)
    e = dtype.itemsize
    parts = moe_terms(model.args.moe, model.args.dim, e, tokens=BATCH * SEQ, sequences=BATCH)
    assert sum(full for full, _ in parts.values()) == measured > 0
    # The sorted token copies alone are a third of the saved bytes or more (k x dim each).
    assert parts["dispatch"][0] >= 3 * e * model.args.moe.top_k * model.args.dim * BATCH * SEQ


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_moe_block_differs_from_the_dense_one_by_what_autograd_saves(dtype):
    # The block formula puts the MoE terms in the feed-forward's place: the difference between
    # an MoE block and a dense one with the same attention is measured, not assumed.
    moe, dense = _model(dtype), _model(dtype, moe_experts=0)
    shape = dict(local_batch_size=BATCH, seq_len=SEQ, tp=1, cp=1, compute_bytes=dtype.itemsize)
    formula = [
        block_activations(m.args, kernel="sdpa", qk_norm=True, **shape)[0] for m in (moe, dense)
    ]
    measured = [_saved_in(m, m.layers["0"]) for m in (moe, dense)]
    assert formula[0] - formula[1] == measured[0] - measured[1] != 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_moe_terms_under_tensor_parallel_are_what_a_sequence_shard_saves(dtype):
    # Tensor parallel runs the MoE on this rank's sequence shard with replicated parameters
    # (parallelisms/moe_tp.py): the terms of the shard's tokens, and the auxiliary loss's
    # statistics averaged over the tp ranks (a fake 2-rank group: collectives do nothing).
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from parallelisms.moe_tp import apply_moe_tp

    if dist.is_initialized():
        pytest.skip("needs a process without a process group")
    model, tp = _model(dtype), 2
    moe = model.layers["0"].feed_forward
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=tp)
    try:
        apply_moe_tp(moe, init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",)))
        shard = torch.randn(BATCH, SEQ // tp, model.args.dim, dtype=dtype, requires_grad=True)
        saved: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            if t.untyped_storage().data_ptr() != shard.untyped_storage().data_ptr():
                saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            moe(shard)
    finally:
        dist.destroy_process_group()
    params = {p.to_local().untyped_storage().data_ptr() for p in moe.parameters()}
    measured = sum(n for ptr, n in saved.items() if ptr not in params)
    tokens = BATCH * SEQ // tp
    parts = moe_terms(model.args.moe, model.args.dim, dtype.itemsize, tokens=tokens,
                      sequences=BATCH, tp=tp)  # fmt: skip
    assert sum(full for full, _ in parts.values()) == measured > 0
