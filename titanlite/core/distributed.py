"""Device, backend and process group: the one place that knows about CUDA vs CPU, so the rest of
the stack runs the same code on gloo as on NCCL."""

from __future__ import annotations

import datetime
import json
import os
import random
import time
from collections.abc import MutableMapping
from pathlib import Path

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


def flight_recorder_env(trace_buf_size: int, folder: Path) -> dict[str, str]:
    """The variables torch 2.13's NCCL process group reads for its flight recorder (names from
    its ProcessGroupNCCL.hpp, FlightRecorder.hpp and libtorch_cpu): the ring buffer's entries
    (TORCH_NCCL_TRACE_BUFFER_SIZE, 0 = off; torch's own default is 2000), a dump when the
    watchdog sees a collective time out, and the dump files' path, to which each rank appends
    its rank (TORCH_FR_DUMP_TEMP_FILE, and TORCH_NCCL_DEBUG_INFO_TEMP_FILE, its older name)."""
    env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": str(trace_buf_size)}
    if trace_buf_size > 0:
        prefix = str(folder / "rank_")
        env.update(
            TORCH_NCCL_DUMP_ON_TIMEOUT="1",
            TORCH_FR_DUMP_TEMP_FILE=prefix,
            TORCH_NCCL_DEBUG_INFO_TEMP_FILE=prefix,
        )
    return env


def enable_flight_recorder(
    device_type: str, trace_buf_size: int, folder: Path, environ: MutableMapping[str, str]
) -> dict[str, str]:
    """On CUDA (NCCL), before the process group exists, which reads them when it is made: put
    flight_recorder_env's variables into `environ` (os.environ), each unless the user set it,
    and make the dump folder. Returns what it set."""
    if device_type != "cuda":
        return {}
    wanted = flight_recorder_env(trace_buf_size, folder)
    if trace_buf_size > 0:
        folder.mkdir(parents=True, exist_ok=True)
    added = {k: v for k, v in wanted.items() if k not in environ}
    environ.update(added)
    return added


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


def shared_check(n_items: int, check, stall_seconds: float, group=None) -> list[str]:
    """Split a slow check of n_items (checksums) over the ranks: rank r runs check(indices) on
    items r, r + world, ...; every rank gets all the problems found, sorted, so all agree.

    No rank waits inside a collective meanwhile: a collective's timeout (the 300 s start-up
    one) would end the run when one rank's share of terabytes takes longer than it. Each rank
    publishes its progress and then its problems in the default group's store; the others
    wait for the results as long as every unfinished rank reports progress at least once
    every `stall_seconds`."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    mine = [i for i in range(n_items) if i % world == rank]
    if world == 1:
        return sorted(set(check(mine)))
    global _shared_checks
    _shared_checks += 1
    store = dist.distributed_c10d._get_default_store()
    tag = f"titanlite/shared_check/{_shared_checks}"
    start, problems = time.perf_counter(), []
    try:
        for done, i in enumerate(mine, 1):
            problems += check([i])
            store.set(f"{tag}/progress/{rank}", str(done))
    except Exception as e:  # told to the others too, who would otherwise wait for a result
        problems.append(f"rank {rank}: {type(e).__name__}: {e}")
        raise
    finally:
        store.set(f"{tag}/result/{rank}", json.dumps(problems))
    own = time.perf_counter() - start
    everyone = _results(store, tag, world, stall_seconds)
    if rank == 0:
        logger.info(
            f"checked {n_items} items on {world} ranks: this rank's {len(mine)} in {own:.1f}s, "
            f"every rank's after {time.perf_counter() - start:.1f}s"
        )
    return sorted({p for ps in everyone for p in ps})


_shared_checks = 0  # calls so far: every rank makes the same ones, in the same order


def _results(store, tag: str, world: int, stall_seconds: float) -> list[list[str]]:
    """Every rank's result under `tag`; TimeoutError naming a rank whose progress stood still
    for `stall_seconds`."""
    keys = [f"{tag}/result/{r}" for r in range(world)]
    last: dict[int, tuple[str, float]] = {}
    pause = 0.01
    # Polled: a TCPStore wait that times out logs a C++ warning each time.
    while not store.check(keys):
        time.sleep(pause)
        pause = min(2 * pause, 1.0)
        now = time.monotonic()
        for r in range(world):
            if store.check([keys[r]]):
                continue
            progress = f"{tag}/progress/{r}"
            seen = store.get(progress).decode() if store.check([progress]) else ""
            if last.get(r, (None, 0.0))[0] != seen:
                last[r] = (seen, now)
            elif now - last[r][1] > stall_seconds:
                raise TimeoutError(
                    f"rank {r} made no progress with its share of the checksums for "
                    f"{stall_seconds:.0f}s (items done: {seen or 'none'}); is its file system hung?"
                )
    return [json.loads(store.get(k)) for k in keys]


def log_layout(world_mesh, description: str, device: torch.device) -> None:
    """The rank -> device -> mesh coordinate map, once, on rank 0."""
    coordinate = dict(zip(world_mesh.mesh_dim_names or (), world_mesh.get_coordinate() or ()))
    mine = f"rank {dist.get_rank()} -> {device} -> {coordinate}"
    everyone: list[str] = [""] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if dist.get_rank() == 0:
        logger.info(f"mesh {description}:\n  " + "\n  ".join(everyone))
