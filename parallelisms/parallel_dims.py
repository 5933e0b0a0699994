"""The parallel layout: degrees, their validation, and the DeviceMesh built from them.

Mesh dims, outermost first: pp, dp_replicate, dp_shard, cp, tp. Tensor parallel is innermost so
that its frequent collectives stay on the fast intra-node links; context parallel next to it (it
all-gathers keys and values every block); pipeline parallel is outermost because it only sends
activations between neighbouring stages, which tolerates the slowest links. Only dims of degree
> 1 are created.

Flattened submeshes: `dp` (replicate x shard): the ranks that read different sequences (data
loading); `dp_cp` (replicate x shard x cp): the ranks that hold different tokens (the loss and its
token count are summed over it); `dp_shard_cp` (shard x cp): FSDP's shard dim. Context-parallel
ranks hold the same parameters, so FSDP shards over them too and averages their gradients, as
TorchTitan does.

Expert parallel borrows its ranks: an MoE's experts are split over `ep` ranks taken from
dp_shard x cp x tp (innermost first, so an EP group holds the tp and cp ranks and the fast links
carry its all-to-all), and what remains of dp_shard x cp x tp, `efsdp`, is the experts' FSDP
dim (with dp_replicate in front under HSDP). Both are views of the same ranks, unflattened from
the flattened dp_shard x cp x tp: the "sparse" mesh next to the dense one, as TorchTitan builds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


@dataclass(frozen=True)
class Meshes:
    """The world mesh and the submeshes each parallelism works on (None when unused)."""

    world: DeviceMesh
    dp: DeviceMesh | None  # flattened replicate x shard: data loading and loss averaging
    fsdp: DeviceMesh | None  # 1D shard, or 2D (replicate, shard) for HSDP
    ddp: DeviceMesh | None  # pure replication
    tp: DeviceMesh | None
    pp: DeviceMesh | None = None
    cp: DeviceMesh | None = None
    dp_cp: DeviceMesh | None = None  # flattened replicate x shard x cp: loss and token sums
    ep: DeviceMesh | None = None  # the experts' split (from dp_shard x cp x tp)
    efsdp: DeviceMesh | None = None  # the experts' FSDP: the rest, (replicate, rest) under HSDP

    def get(self, name: str) -> DeviceMesh:
        """The submesh `name`, for a parallelism its layout has enabled."""
        mesh = getattr(self, name)
        if mesh is None:
            raise ValueError(f"no {name} submesh in this layout")
        return mesh

    def dp_groups(self) -> list[list[int]]:
        """The global ranks of every data-parallel group of the world, each in dp order: one
        group per combination of the other dims' coordinates ([] without data parallelism)."""
        if self.dp is None:
            return []
        names = self.world.mesh_dim_names or ()
        dp_dims = [i for i, n in enumerate(names) if n.startswith("dp_")]
        others = [i for i in range(len(names)) if i not in dp_dims]
        ranks = self.world.mesh.permute(*others, *dp_dims)
        return ranks.reshape(-1, self.dp.size()).tolist()

    def groups(self) -> list[dist.ProcessGroup]:
        """Every process group of this rank's meshes (one per world dim, and the flattened dp)."""
        found = [self.world.get_group(i) for i in range(self.world.ndim)]
        found += [m.get_group() for m in (self.dp, self.dp_cp, self.ep) if m is not None]
        for mesh in (self.fsdp, self.efsdp):
            if mesh is not None:
                found += [mesh.get_group(i) for i in range(mesh.ndim)]
        return list({id(g): g for g in found}.values())


class LayoutError(ValueError):
    """An impossible parallel layout; the message names the setting and the fix."""


@dataclass(frozen=True)
class ParallelDims:
    dp_replicate: int
    dp_shard: int
    tp: int
    world_size: int
    pp: int = 1
    cp: int = 1
    ep: int = 1

    @classmethod
    def resolve(
        cls,
        dp_replicate: int,
        dp_shard: int,
        tp: int,
        world_size: int,
        pp: int = 1,
        cp: int = 1,
        ep: int = 1,
    ) -> ParallelDims:
        """Fill in dp_shard = -1 from the world size and check that the degrees multiply to it
        and that expert parallel divides the ranks it borrows from."""
        for name, value in (
            ("data_parallel_replicate_degree", dp_replicate),
            ("tensor_parallel_degree", tp),
            ("pipeline_parallel_degree", pp),
            ("context_parallel_degree", cp),
            ("expert_parallel_degree", ep),
        ):
            if value < 1:
                raise LayoutError(f"parallelism.{name} = {value}: must be >= 1")
        others = f"data_parallel_replicate_degree ({dp_replicate}) x tensor_parallel_degree ({tp})"
        if cp > 1:
            others = f"context_parallel_degree ({cp}) x " + others
        if pp > 1:
            others = f"pipeline_parallel_degree ({pp}) x " + others
        rest = pp * dp_replicate * tp * cp
        if dp_shard == -1:
            if world_size % rest:
                raise LayoutError(
                    f"world size {world_size} is not divisible by {others}; change the degrees "
                    "or the number of processes (NGPU)"
                )
            dp_shard = world_size // rest
        if dp_shard < 1:
            raise LayoutError(
                f"parallelism.data_parallel_shard_degree = {dp_shard}: must be -1 or >= 1"
            )
        if rest * dp_shard != world_size:
            raise LayoutError(
                f"{others} x data_parallel_shard_degree ({dp_shard}) = "
                f"{rest * dp_shard}, but the world size is {world_size}; make "
                "the product equal the number of processes (or set data_parallel_shard_degree "
                "= -1)"
            )
        borrowed = dp_shard * cp * tp
        if borrowed % ep:
            raise LayoutError(
                f"parallelism.expert_parallel_degree = {ep} does not divide "
                f"data_parallel_shard_degree ({dp_shard}) x context_parallel_degree ({cp}) x "
                f"tensor_parallel_degree ({tp}) = {borrowed}, the ranks expert parallel borrows; "
                "pick a divisor of it"
            )
        return cls(dp_replicate, dp_shard, tp, world_size, pp, cp, ep)

    @property
    def dp_size(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def loss_ranks(self) -> int:
        """Ranks that hold different tokens of a step: data-parallel x context-parallel."""
        return self.dp_size * self.cp

    @property
    def fsdp_enabled(self) -> bool:
        """FSDP shards over dp_shard x cp: context-parallel ranks hold the same parameters."""
        return self.dp_shard * self.cp > 1

    @property
    def ddp_enabled(self) -> bool:
        """Pure replication: replicas but no sharding (DDP, as TorchTitan does)."""
        return self.dp_replicate > 1 and self.dp_shard * self.cp == 1

    @property
    def ep_enabled(self) -> bool:
        return self.ep > 1

    @property
    def efsdp(self) -> int:
        """The experts' FSDP degree: what expert parallel leaves of dp_shard x cp x tp."""
        return self.dp_shard * self.cp * self.tp // self.ep

    @property
    def cp_enabled(self) -> bool:
        return self.cp > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    def mesh_shape(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        dims = [
            (d, n)
            for d, n in (
                (self.pp, "pp"),
                (self.dp_replicate, "dp_replicate"),
                (self.dp_shard, "dp_shard"),
                (self.cp, "cp"),
                (self.tp, "tp"),
            )
            if d > 1
        ]
        if not dims:
            dims = [(1, "dp_shard")]
        return tuple(d for d, _ in dims), tuple(n for _, n in dims)

    def build_meshes(self, device_type: str, timeout: timedelta | None = None) -> Meshes:
        """The meshes; their groups get `timeout`, by default the default group's (which the
        trainer sets from comm.init_timeout_seconds)."""
        shape, names = self.mesh_shape()
        world = init_device_mesh(device_type, shape, mesh_dim_names=names)
        dp_names = tuple(n for n in names if n.startswith("dp_"))
        # The flattened mesh is kept here: slicing it back out of the root mesh is deprecated.
        dp = world[dp_names]._flatten("dp") if self.dp_size > 1 else None
        dp_cp = dp
        if self.cp_enabled:
            dp_cp = world[(*dp_names, "cp")]._flatten("dp_cp") if dp is not None else world["cp"]
        fsdp = None
        if self.fsdp_enabled:
            shard_names = tuple(n for n in ("dp_shard", "cp") if n in names)
            shard = (
                world[shard_names]._flatten("dp_shard_cp")
                if len(shard_names) > 1
                else world[shard_names[0]]
            )
            # HSDP: (replicate, shard); concatenated rather than sliced back out of the root
            # mesh, which torch deprecates for flattened dims.
            fsdp = (
                DeviceMesh._concatenate([world["dp_replicate"], shard])
                if self.dp_replicate > 1
                else shard
            )
        meshes = Meshes(
            world=world,
            dp=dp,
            fsdp=fsdp,
            ddp=world["dp_replicate"] if self.ddp_enabled else None,
            tp=world["tp"] if self.tp_enabled else None,
            pp=world["pp"] if self.pp_enabled else None,
            cp=world["cp"] if self.cp_enabled else None,
            dp_cp=dp_cp,
            **(self._expert_meshes(world) if self.ep_enabled else {}),
        )
        # torch gives every group it creates for a mesh the backend's default timeout (30 min
        # on gloo, 10 on NCCL), not the default group's: a hung FSDP or TP collective would
        # outwait the configured timeout by far.
        timeout = timeout or _timeout_of(dist.distributed_c10d._get_default_group())
        if timeout is not None:
            for group in meshes.groups():
                dist.distributed_c10d._set_pg_timeout(timeout, group)
        return meshes

    def _expert_meshes(self, world: DeviceMesh) -> dict[str, DeviceMesh | None]:
        names = tuple(n for n in ("dp_shard", "cp", "tp") if n in (world.mesh_dim_names or ()))
        borrowed = world[names]._flatten("dp_shard_cp_tp") if len(names) > 1 else world[names[0]]
        sparse = borrowed._unflatten(0, (self.efsdp, self.ep), ("efsdp", "ep"))
        efsdp = sparse["efsdp"]
        if self.dp_replicate > 1:
            efsdp = DeviceMesh._concatenate([world["dp_replicate"], efsdp])
        return {"ep": sparse["ep"], "efsdp": efsdp if self.fsdp_enabled else None}

    def describe(self) -> str:
        shape, names = self.mesh_shape()
        text = " x ".join(f"{n}={d}" for d, n in zip(shape, names))
        if self.ep_enabled:
            text += f", experts: ep={self.ep} x efsdp={self.efsdp}"
        return text + f" (world {self.world_size})"


def _timeout_of(group: dist.ProcessGroup) -> timedelta | None:
    for device in group._device_types:
        options = getattr(group._get_backend(device), "options", None)
        if options is not None:
            return options._timeout
    return None


def check_layout(
    dims: ParallelDims,
    *,
    n_heads: int,
    n_kv_heads: int,
    seq_len: int,
    local_batch_size: int,
    global_batch_size: int,
    device_type: str,
    async_tp: bool,
    compile: bool,
    num_experts: int = 0,
) -> None:
    """Everything about a layout that can be known before any process group or model exists."""
    if dims.ep > 1 and (not num_experts or num_experts % dims.ep):
        raise LayoutError(
            f"parallelism.expert_parallel_degree = {dims.ep} needs a Mixture-of-Experts model "
            f"whose expert count it divides; this model has {num_experts} experts"
            + (": pick an MoE flavor" if not num_experts else ": pick a divisor of it")
        )
    if dims.tp > 1:
        for name, value in (("n_heads", n_heads), ("n_kv_heads", n_kv_heads)):
            if value % dims.tp:
                raise LayoutError(
                    f"model {name} = {value} is not divisible by parallelism.tensor_parallel_degree"
                    f" = {dims.tp}; pick a tensor-parallel degree that divides it"
                )
        if seq_len % dims.tp:
            raise LayoutError(
                f"training.seq_len = {seq_len} is not divisible by tensor_parallel_degree = "
                f"{dims.tp} (sequence parallel splits the sequence over the tp ranks)"
            )
    if global_batch_size != -1 and global_batch_size % (local_batch_size * dims.dp_size):
        raise LayoutError(
            f"training.global_batch_size = {global_batch_size} is not a multiple of "
            f"local_batch_size ({local_batch_size}) x data-parallel degree ({dims.dp_size}); "
            "it must split into whole micro-batches on every data-parallel rank"
        )
    if dims.ddp_enabled and dims.tp > 1:
        raise LayoutError(
            "data_parallel_replicate_degree > 1 with data_parallel_shard_degree = 1 (DDP) does not "
            "compose with tensor parallel; use data_parallel_shard_degree > 1 (FSDP / HSDP) instead"
        )
    if async_tp:
        if dims.tp == 1:
            raise LayoutError(
                "parallelism.enable_async_tensor_parallel needs tensor_parallel_degree > 1"
            )
        if device_type != "cuda":
            raise LayoutError(
                "parallelism.enable_async_tensor_parallel needs CUDA GPUs (symmetric memory); "
                "turn it off on CPU"
            )
        if not compile:
            raise LayoutError(
                "parallelism.enable_async_tensor_parallel needs training.compile = true"
            )
