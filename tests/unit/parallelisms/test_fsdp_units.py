"""How FSDP wraps a Llama model: the embedding, each block, and the final norm with the head
are separate units (so that the embedding's all-gather and the head's reduce-scatter overlap
with the blocks' compute), the root holds no parameter of its own, and each unit frees its
gathered parameters after forward as the policy says. Built on meta tensors over a fake
2-rank process group: the wrapping is what is checked here, the numerics by the parity suites."""

import pytest
import torch
import torch.distributed as dist
from helpers import tiny_llama_args
from torch.distributed.fsdp import FSDPModule
from torch.testing._internal.distributed.fake_pg import FakeStore

from models.llama import Transformer
from parallelisms import ParallelDims, ParallelizeOptions
from parallelisms.llama import parallelize_llama


@pytest.fixture
def fake_two_ranks():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _units(policy: str) -> dict[str, tuple[list[str], bool]]:
    """{unit's first module: (its parameters' names, freed after forward)}."""
    dims = ParallelDims.resolve(1, 2, 1, 2)
    with torch.device("meta"):
        model = Transformer(tiny_llama_args(n_layers=3))
    parallelize_llama(
        model, dims, dims.build_meshes("cpu"), ParallelizeOptions(reshard_after_forward=policy)
    )
    names = {id(p): n for n, p in model.named_parameters()}
    units = {}
    for name, module in model.named_modules():
        if not isinstance(module, FSDPModule):
            continue
        group = module._get_fsdp_state()._fsdp_param_group
        if group is None:  # the root, or a module that shares its unit's state
            units.setdefault(name or "<root>", ([], False))
            continue
        params = sorted(names[id(p.sharded_param)] for p in group.fsdp_params)
        units[name] = (params, group.post_forward_mesh_info is not None)
    return units


def test_embedding_blocks_and_head_are_units_of_their_own(fake_two_ranks):
    units = _units("default")
    assert units["tok_embeddings"] == (["tok_embeddings.weight"], True)
    # The norm and the head are one unit: backward needs them first, so they stay gathered.
    head = units.get("norm") or units["output"]
    assert head == (["norm.weight", "output.weight"], False)
    assert units["<root>"] == ([], False)
    # Every block is a unit; all but the last free their gathered parameters after forward.
    freed = [units[f"layers.{i}"][1] for i in range(3)]
    assert freed == [True, True, False]
    assert all(units[f"layers.{i}"][0][0].startswith(f"layers.{i}.") for i in range(3))


@pytest.mark.parametrize("policy, freed", [("always", True), ("never", False)])
def test_every_unit_follows_always_and_never(fake_two_ranks, policy, freed):
    units = _units(policy)
    for name, (params, after_forward) in units.items():
        if params:
            assert after_forward is freed, name
