"""Device, backend and process group: the one place that knows about CUDA vs CPU, so the rest of
the stack runs the same code on gloo as on NCCL."""

from __future__ import annotations

import datetime
import os
import random

import torch
import torch.distributed as dist

from titanlite.core.logging import logger


def device_type() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def local_device() -> torch.device:
    if device_type() == "cuda":
        return torch.device(
            "cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
        )
    return torch.device("cpu")


def backend_for(device: torch.device) -> str:
    # CPU tensors still travel over gloo on GPU machines (e.g. object collectives).
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


def launched_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def init(timeout_seconds: int) -> torch.device:
    """Create the default process group. Without torchrun, a one-process group on an in-memory
    store, so single-process runs go through exactly the same code. A group that a launcher has
    already made (Ray Train's TorchTrainer, see titanlite/ray_launch.py) is used as it is."""
    if dist.is_initialized():
        # The launcher has chosen this rank's GPU too (torch.cuda.set_device); its choice holds.
        if device_type() == "cuda":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
    device = local_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=timeout_seconds)
    device_id = device if device.type == "cuda" else None
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if (
        "RANK" in os.environ
        and restart != "0"
        and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    ):
        # After torchrun restarts a failed group, the workers share the agent's store with the
        # dead group, whose keys (gloo's listening addresses) are still there: a new rank can
        # read a dead rank's address before its peer overwrites it ("connectFullMesh ...
        # Connection refused"). A key prefix per restart keeps the groups apart.
        store = dist.PrefixStore(
            f"titanlite_restart_{restart}",
            dist.TCPStore(
                os.environ["MASTER_ADDR"],
                int(os.environ["MASTER_PORT"]),
                is_master=False,
                timeout=timeout,
            ),
        )
        dist.init_process_group(
            backend_for(device),
            store=store,
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            timeout=timeout,
            device_id=device_id,
        )
    elif "RANK" in os.environ:
        dist.init_process_group(backend_for(device), timeout=timeout, device_id=device_id)
    else:
        dist.init_process_group(
            backend_for(device), store=dist.HashStore(), rank=0, world_size=1, timeout=timeout
        )
    return device


def set_timeout(seconds: int, skip: tuple = ()) -> None:
    """Set the collective timeout of every process group of this rank (the default one and those
    of the device meshes) but those in `skip`, which keep their own (the checkpoint's)."""
    timeout = datetime.timedelta(seconds=seconds)
    for group in list(dist.distributed_c10d._world.pg_map):
        if group not in skip:
            dist.distributed_c10d._set_pg_timeout(timeout, group)


def check_distinct_devices(device: torch.device) -> None:
    """Two ranks on one GPU is the most common launch mistake: fail on every rank, clearly."""
    if device.type != "cuda" or dist.get_world_size() == 1:
        return
    key = f"{os.uname().nodename}:{torch.cuda.get_device_properties(device).uuid}"
    keys: list[str] = [""] * dist.get_world_size()
    dist.all_gather_object(keys, key)
    if len(set(keys)) != len(keys):
        raise RuntimeError(
            "several ranks share one GPU; launch one process per GPU (NGPU = number of GPUs, "
            "CUDA_VISIBLE_DEVICES set per node)"
        )


def agree_on_seed(seed: int | None) -> int:
    """The configured seed, or a fresh one drawn on rank 0 and shared, so that every rank
    initializes the same model and the run can be reproduced from the logged value."""
    if seed is not None:
        return seed
    box = [random.SystemRandom().randrange(2**31)]
    dist.broadcast_object_list(box, src=0)
    return int(box[0])


def set_determinism(seed: int, deterministic: bool) -> None:
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


def shared_check(n_items: int, check, group=None) -> list[str]:
    """Split a slow check of n_items (checksums) over the ranks: rank r runs check(indices) on
    items r, r + world, ...; every rank gets all the problems found, sorted, so all agree."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    problems = check([i for i in range(n_items) if i % world == rank])
    everyone: list[list[str]] = [[] for _ in range(world)]
    dist.all_gather_object(everyone, problems, group=group)
    return sorted({p for ps in everyone for p in ps})


def log_layout(world_mesh, description: str, device: torch.device) -> None:
    """The rank -> device -> mesh coordinate map, once, on rank 0."""
    coordinate = dict(zip(world_mesh.mesh_dim_names or (), world_mesh.get_coordinate() or ()))
    mine = f"rank {dist.get_rank()} -> {device} -> {coordinate}"
    everyone: list[str] = [""] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if dist.get_rank() == 0:
        logger.info(f"mesh {description}:\n  " + "\n  ".join(everyone))
