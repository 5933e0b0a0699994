"""Mesh shapes for a table of layouts (fake process group: planning, no cluster here) and the
error text of every impossible layout."""

import pytest
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from parallelisms import LayoutError, ParallelDims, check_layout


@pytest.fixture
def fake_world():
    def init(world_size: int, rank: int = 0):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)

    yield init
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.parametrize(
    "world, degrees, shape, names, dp",
    [
        (1, (1, -1, 1), (1,), ("dp_shard",), 1),
        (8, (1, -1, 1), (8,), ("dp_shard",), 8),
        (2, (2, 1, 1), (2,), ("dp_replicate",), 2),
        (4, (1, -1, 4), (4,), ("tp",), 1),
        (8, (1, -1, 2), (4, 2), ("dp_shard", "tp"), 4),
        (8, (2, -1, 1), (2, 4), ("dp_replicate", "dp_shard"), 8),
        (8, (2, 2, 2), (2, 2, 2), ("dp_replicate", "dp_shard", "tp"), 4),
        (256, (1, -1, 8), (32, 8), ("dp_shard", "tp"), 32),
    ],
)
def test_mesh_shapes(fake_world, world, degrees, shape, names, dp):
    fake_world(world, rank=world - 1)
    dims = ParallelDims.resolve(*degrees, world)
    meshes = dims.build_meshes("cpu")
    assert tuple(meshes.world.shape) == shape and meshes.world.mesh_dim_names == names
    assert dims.dp_size == dp
    assert (meshes.dp.size() if meshes.dp else 1) == dp
    assert (meshes.tp.size() if meshes.tp else 1) == dims.tp


def test_3d_hsdp_tp_mesh_coordinates(fake_world):
    fake_world(8, rank=5)  # rank 5 = (replica 1, shard 0, tp 1)
    dims = ParallelDims.resolve(2, 2, 2, 8)
    meshes = dims.build_meshes("cpu")
    assert list(meshes.world.get_coordinate()) == [1, 0, 1]
    assert meshes.fsdp.mesh_dim_names == ("dp_replicate", "dp_shard")
    assert meshes.dp.get_local_rank() == 2  # replica 1 x 2 shards + shard 0
    assert meshes.tp.get_local_rank() == 1 and meshes.ddp is None
    assert dims.fsdp_enabled and not dims.ddp_enabled


@pytest.mark.parametrize(
    "world, rank, degrees, ep, ep_ranks, efsdp_ranks",
    [
        # (dp_replicate, dp_shard, tp, pp, cp); the ranks of this rank's ep and efsdp groups
        (4, 1, (1, 4, 1, 1, 1), 2, [0, 1], [1, 3]),
        (4, 2, (1, 4, 1, 1, 1), 4, [0, 1, 2, 3], [2]),
        (8, 5, (1, 2, 2, 1, 2), 4, [4, 5, 6, 7], [1, 5]),  # borrows tp, then cp
        (8, 5, (1, 2, 2, 1, 2), 2, [4, 5], [1, 3, 5, 7]),  # the tp pair
        (8, 5, (2, 2, 2, 1, 1), 2, [4, 5], [[1, 3], [5, 7]]),  # HSDP: (replicate, efsdp)
        (8, 5, (1, 2, 1, 2, 2), 4, [4, 5, 6, 7], [5]),  # inside a pipeline stage
    ],
)
def test_expert_parallel_meshes(fake_world, world, rank, degrees, ep, ep_ranks, efsdp_ranks):
    """EP borrows the innermost ranks of dp_shard x cp x tp; efsdp, the experts' FSDP, is what
    remains (behind dp_replicate under HSDP), each a view of the same ranks."""
    fake_world(world, rank=rank)
    dp_replicate, dp_shard, tp, pp, cp = degrees
    dims = ParallelDims.resolve(dp_replicate, dp_shard, tp, world, pp, cp, ep)
    meshes = dims.build_meshes("cpu")
    assert meshes.get("ep").mesh.tolist() == ep_ranks
    if dims.fsdp_enabled:
        assert meshes.get("efsdp").mesh.tolist() == efsdp_ranks
    assert dims.efsdp * ep == dp_shard * cp * tp
    assert f"experts: ep={ep} x efsdp={dims.efsdp}" in dims.describe()


@pytest.mark.parametrize(
    "world, rank, degrees, names, fsdp_names, fsdp_size",
    [
        # (dp_replicate, dp_shard, tp, pp, cp)
        (2, 1, (1, 1, 1, 1, 2), ("cp",), ("cp",), 2),
        (8, 5, (1, 2, 2, 1, 2), ("dp_shard", "cp", "tp"), ("dp_shard_cp",), 4),
        (8, 5, (2, 1, 1, 2, 2), ("pp", "dp_replicate", "cp"), ("dp_replicate", "cp"), 4),
        (16, 13, (2, 2, 2, 1, 2), ("dp_replicate", "dp_shard", "cp", "tp"), None, 8),
    ],
)
def test_context_parallel_meshes(fake_world, world, rank, degrees, names, fsdp_names, fsdp_size):
    """cp sits between dp_shard and tp; FSDP shards over dp_shard x cp (CP ranks hold the same
    parameters); the loss mesh dp_cp spans every rank holding different tokens, while the data
    mesh dp leaves cp out (CP ranks read the same sequences)."""
    fake_world(world, rank=rank)
    dp_replicate, dp_shard, tp, pp, cp = degrees
    dims = ParallelDims.resolve(dp_replicate, -1, tp, world, pp, cp)
    assert dims.dp_shard == dp_shard and dims.fsdp_enabled and not dims.ddp_enabled
    meshes = dims.build_meshes("cpu")
    assert meshes.world.mesh_dim_names == names
    assert meshes.get("cp").size() == cp
    assert meshes.get("dp_cp").size() == dims.loss_ranks == dp_replicate * dp_shard * cp
    assert (meshes.dp.size() if meshes.dp else 1) == dp_replicate * dp_shard
    assert meshes.get("fsdp").size() == fsdp_size
    if fsdp_names is not None:
        assert meshes.get("fsdp").mesh_dim_names == fsdp_names
    # The flattened shard dim holds exactly this rank's dp_shard x cp peers.
    coord = dict(zip(names, meshes.world.get_coordinate()))
    if "dp_shard" in names:
        shard_mesh = meshes.fsdp if meshes.fsdp.ndim == 1 else meshes.fsdp["dp_shard_cp"]
        assert shard_mesh.get_local_rank() == coord["dp_shard"] * cp + coord["cp"]


LAYOUT = dict(
    n_heads=16,
    n_kv_heads=8,
    seq_len=2048,
    local_batch_size=2,
    global_batch_size=-1,
    device_type="cpu",
    async_tp=False,
    compile=False,
)


@pytest.mark.parametrize(
    "degrees, world, overrides, message",
    [
        (
            (1, -1, 3),
            8,
            {},
            "world size 8 is not divisible by data_parallel_replicate_degree (1) x tensor_parallel_degree (3)",
        ),
        ((1, 3, 2), 8, {}, "= 6, but the world size is 8"),
        (
            (1, -1, 16),
            16,
            {},
            "n_kv_heads = 8 is not divisible by parallelism.tensor_parallel_degree = 16",
        ),
        ((1, -1, 4), 4, {"n_heads": 6}, "n_heads = 6 is not divisible"),
        (
            (1, -1, 4),
            4,
            {"seq_len": 2050},
            "seq_len = 2050 is not divisible by tensor_parallel_degree = 4",
        ),
        (
            (1, -1, 1),
            4,
            {"global_batch_size": 12},
            "global_batch_size = 12 is not a multiple of local_batch_size (2) x data-parallel degree (4)",
        ),
        ((1, -1, 2), 2, {"async_tp": True}, "enable_async_tensor_parallel needs CUDA GPUs"),
        ((1, -1, 1), 2, {"async_tp": True}, "needs tensor_parallel_degree > 1"),
        ((2, 1, 2), 4, {}, "does not compose with tensor parallel"),
    ],
)
def test_bad_layouts(degrees, world, overrides, message):
    with pytest.raises(LayoutError) as e:
        dims = ParallelDims.resolve(*degrees, world)
        check_layout(dims, **{**LAYOUT, **overrides})
    assert message in str(e.value) and "\n" not in str(e.value)
