"""Training on a Ray cluster (KubeRay, `ray start`, or a local Ray instance) with Ray Train:

    python scripts/ray_train.py --config NAME|PATH --num-workers N [--use-gpu] [--max-failures K]
        [--address ADDR] [--log-ranks 0] [--section.key value ...]

The driver checks the config for N ranks first (a mistake is one line and exit code 2, and Ray is
not started), then Ray Train's `TorchTrainer` places N workers and makes their process group;
each worker runs titanlite's own entry point (`titanlite.cli`) on that group, so the
training, its checkpoints and its metrics are those of `./run_train.sh` with the same config.
A worker that crashes or dies makes Ray restart the whole group (`FailureConfig`, up to K times),
and the new group resumes from the latest checkpoint in the dump folder. See docs/ray.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from titanlite.config.schema import WORLD_MAX
from titanlite.core.arguments import ArgumentParser, int_arg
from titanlite.core.errors import report

# The config run_train.sh uses when none is given.
DEFAULT_CONFIG = "debug_model.toml"


def worker(ctx: dict[str, Any]) -> tuple[int, str]:
    """One Ray Train worker: titanlite's entry point on the group Ray made (RANK, WORLD_SIZE,
    LOCAL_RANK and MASTER_ADDR/PORT are set, the default process group exists). Returns the
    exit code and, when it is not 0, the one line that says why: the driver prints rank 0's,
    last (every rank printing it too would repeat it, prefixed, in the driver's output)."""
    from titanlite import cli
    from titanlite.core.logging import init_logger, logger

    # Ray moves each worker into a folder of its own; relative paths in the config (the dump
    # folder, data) mean what they mean to the driver, as with run_train.sh.
    if os.path.isdir(ctx["cwd"]):
        os.chdir(ctx["cwd"])
    init_logger()
    if os.environ.get("RANK", "0") not in ctx["log_ranks"]:
        # run_train.sh's LOG_RANK: the other ranks say only what goes wrong.
        logger.setLevel(logging.WARNING)
    return cli.outcome(ctx["argv"])


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = ArgumentParser(prog="titanlite", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=DEFAULT_CONFIG, help="a path or a name in train_configs/")
    p.add_argument(
        "--num-workers",
        type=int_arg(1, WORLD_MAX),
        required=True,
        help="ranks (one per GPU with --use-gpu)",
    )
    p.add_argument("--use-gpu", action="store_true", help="one GPU per worker (NCCL)")
    p.add_argument(
        "--max-failures",
        type=int_arg(-1, 10**6),
        default=0,
        help="times Ray restarts the group after a worker fails (-1: always); it resumes from "
        "the latest checkpoint",
    )
    p.add_argument(
        "--address",
        default=None,
        help="an existing Ray cluster (default: RAY_ADDRESS, else a local Ray instance)",
    )
    p.add_argument("--log-ranks", default="0", help="comma-separated ranks whose log is shown")
    return p.parse_known_args(argv)


def _check(args: argparse.Namespace, overrides: list[str]) -> tuple[Any, list[str]]:
    """The job for N ranks on the workers' device, and the workers' command line (the config as
    an absolute path: Ray runs workers in other folders)."""
    from titanlite.config import loader as config
    from titanlite.preflight import checks as preflight

    job = config.load(["--config", args.config, *overrides])
    # Checked for the workers' device, not the driver's (often a GPU-less head node).
    preflight.check(job, args.num_workers, device="cuda" if args.use_gpu else "cpu")
    path = config.resolve_config_path(args.config).resolve()
    return job, ["--config", str(path), *overrides]


def _quiet_placement_group_cleaner() -> None:
    # Ray Train's placement-group cleaner asks the State API, which lives in the dashboard, every
    # second whether the run's controller is alive, and warns each time it cannot; the dashboard
    # is not part of ray[train]. The local instance ends with this process anyway.
    name = "ray.train.v2._internal.execution.controller.placement_group_cleaner"
    logging.getLogger(name).setLevel(logging.ERROR)


def _start_ray(args: argparse.Namespace) -> None:
    import ray

    if args.address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=args.address)
    else:
        # A local instance sized for the workers (Ray counts logical CPUs; one per worker).
        ray.init(
            num_cpus=args.num_workers,
            include_dashboard=False,
            runtime_env={"worker_process_setup_hook": _quiet_placement_group_cleaner},
        )


def main(argv: list[str]) -> int:
    args, overrides = _parse(argv)
    from titanlite.preflight import checks as preflight

    try:
        job, worker_argv = _check(args, overrides)
    except preflight.user_errors() as e:
        return report(e)
    try:
        import ray
        import ray.train
        from ray.train.torch import TorchConfig, TorchTrainer
    except ImportError:
        return report("Ray Train is not installed; pip install -e '.[ray]'")
    import torch

    from titanlite.core.distributed import backend_for

    _start_ray(args)
    if args.use_gpu and (gpus := ray.cluster_resources().get("GPU", 0)) < args.num_workers:
        # Ray Train would wait for GPUs that never come, retrying the start-up forever.
        ray.shutdown()
        return report(
            f"--use-gpu: the Ray cluster has {gpus:g} GPU(s) and --num-workers "
            f"{args.num_workers} needs {args.num_workers} (one per worker); add GPUs, lower "
            "--num-workers, or drop --use-gpu to train on CPU"
        )
    dump = Path(job.job.dump_folder).resolve()
    trainer = TorchTrainer(
        worker,  # type: ignore[arg-type]  # (Ray's hint says None; Train V2 keeps rank 0's value)
        train_loop_config={
            "argv": worker_argv,
            "cwd": os.getcwd(),
            "log_ranks": args.log_ranks.split(","),
        },
        # The group titanlite would make itself: gloo on CPU; on GPU, NCCL with gloo for CPU
        # tensors (object collectives), and the same start-up timeout.
        torch_config=TorchConfig(
            backend=backend_for(torch.device("cuda" if args.use_gpu else "cpu")),
            timeout_s=job.comm.init_timeout_seconds,
        ),
        scaling_config=ray.train.ScalingConfig(num_workers=args.num_workers, use_gpu=args.use_gpu),
        run_config=ray.train.RunConfig(
            name="ray",
            storage_path=str(dump),
            failure_config=ray.train.FailureConfig(max_failures=args.max_failures),
        ),
    )
    try:
        result = trainer.fit()
    except ray.train.TrainingFailedError as e:
        ray.shutdown()  # Ray's own report of the failure is printed before our line
        return report(
            f"Ray Train stopped the run (--max-failures {args.max_failures}): {_reason(e)}", 1
        )
    ray.shutdown()
    code, line = result.return_value  # type: ignore[attr-defined]  # (fit() names V1's Result)
    if line:
        print(line, file=sys.stderr)
    return int(code)


def _reason(error: Exception) -> str:
    """The root cause in one line: a worker that died (the others then fail in their next
    collective, which says nothing new), else the lowest rank's own error."""
    from ray.exceptions import RayActorError

    failures: dict[int, Exception] = getattr(error, "worker_failures", None) or {}
    died = [
        r
        for r, f in failures.items()
        if isinstance(getattr(f, "health_check_failure", f), RayActorError)
    ]
    if died:
        return f"rank {min(died)}'s worker process died"
    if failures:
        rank = min(failures)
        return f"rank {rank}: {_last_line(str(failures[rank]))}"
    return _last_line(str(error))


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no reason given"
