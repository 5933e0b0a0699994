"""Collective timeouts. comm.train_timeout_seconds reaches every process group the meshes
create, not only the default one: on FSDP 2 x TP 2, a rank that stalls before a TP-group
collective in step 2 makes its TP peer time out after train_timeout seconds, and the whole
group exits non-zero. (torch creates mesh groups with its own default, 30 minutes on gloo: that
run would hang for half an hour.) It applies from the end of the first step on, and never to the
checkpoint's group, which keeps checkpoint.timeout_seconds: a slow first step, a slow writer and
a slow Hugging Face export each finish (tests/distributed/fault_worker.py plants them). And
every kind of group the meshes build (dp_replicate, dp_shard, the flattened dp, cp, tp, pp) gets
it: after the trainer's first step, a rank that stays away from a collective in that group makes
its peer time out after train_timeout seconds (tests/distributed/group_stall_worker.py)."""

import json
import re
import time

import group_stall_worker
import pytest
from helpers import DEBUG_CONFIG, NO_EVAL, ROOT, launch_worker, spawn, torchrun

from titanlite.data.prepare import prepare

TRAIN_TIMEOUT = 5
# Rank 3 stalls; its TP peer is rank 2 (tp is the innermost mesh dim).
STALL_RANK, TP_PEER = 3, 2
CORPUS = ROOT / "titanlite" / "assets" / "corpus"


def _tiny(tmp_path, steps: int, train_timeout: int, *extra: str) -> list[str]:
    """A one-block debug run of `steps` steps with the training timeout `train_timeout`."""
    return [
        "--config",
        str(DEBUG_CONFIG),
        "--model.n_layers",
        "1",
        "--training.seq_len",
        "64",
        "--training.local_batch_size",
        "2",
        "--training.steps",
        str(steps),
        "--metrics.enable_tensorboard",
        "false",
        *NO_EVAL,
        "--comm.train_timeout_seconds",
        str(train_timeout),
        *extra,
        "--job.dump_folder",
        str(tmp_path),
    ]


def _args(tmp_path) -> list[str]:
    return _tiny(tmp_path, 4, TRAIN_TIMEOUT, "--parallelism.tensor_parallel_degree", "2")


@pytest.mark.slow
def test_stalled_tp_collective_times_out(tmp_path):
    args = _args(tmp_path)
    proc = torchrun(4, ["tests/distributed/stall_worker.py", str(STALL_RANK)], args, timeout=300)
    end = time.time()
    assert proc.returncode != 0, proc.stderr[-3000:]
    stalled_at = float(re.search(r"STALL_START (\d+\.\d+)", proc.stderr).group(1))
    timed_out = re.search(
        rf"\[rank{TP_PEER}\].*Timed out waiting {TRAIN_TIMEOUT * 1000}ms", proc.stderr
    )
    assert timed_out, proc.stderr[-6000:]
    elapsed = end - stalled_at
    print(f"\nstall -> group exit: {elapsed:.1f} s (train_timeout {TRAIN_TIMEOUT} s)")
    # Measured ~10 s on 2 busy cores: the timeout, then torchrun stopping the other ranks.
    assert elapsed < TRAIN_TIMEOUT + 15, elapsed


@pytest.mark.slow
def test_a_timed_out_group_restarts_and_resumes_from_its_checkpoint(tmp_path):
    """What MAX_RESTARTS is for: torchrun restarts the group after the timeout, and the new
    group (whose ranks no longer stall) resumes from the last checkpoint and finishes."""
    args = [*_args(tmp_path), "--checkpoint.enable_checkpoint", "--checkpoint.interval", "1"]
    proc = torchrun(
        4,
        ["--max-restarts=1", "tests/distributed/stall_worker.py", str(STALL_RANK)],
        args,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert proc.stderr.count("STALL_START") == 1
    assert re.search(rf"Timed out waiting {TRAIN_TIMEOUT * 1000}ms", proc.stderr)
    assert "resuming at step 1" in proc.stderr, proc.stderr[-6000:]
    assert "training done: 4 steps" in proc.stderr


SLOW = 8  # seconds: over the training timeout below, under the start-up and checkpoint ones
SHARD_SLOW = 2.5  # seconds per shard: under the start-up timeout, 4 shards over it
FAULTS = {
    # Rank 1's first forward is late: its peers wait in step 1's first FSDP collective.
    "slow_first_step": ("1", []),
    # Rank 1 writes its part of the step-1 checkpoint late: rank 0 waits in the save.
    "slow_writer": ("1", []),
    # Rank 0 exports the final checkpoint as a Hugging Face folder, slower than even the
    # checkpoint group's timeout: no other rank may wait for it in a collective.
    "slow_export": ("0", ["--checkpoint.last_save_in_hf", "--checkpoint.timeout_seconds", "4"]),
    # Rank 1 checksums each of its 4 prepared shards (of 9) in 2.5 s, 10 s in all: past the
    # start-up timeout, which rank 0 must therefore not wait in.
    "slow_shard_check": ("1", ["--comm.init_timeout_seconds", "5"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("fault", list(FAULTS))
def test_slow_first_step_writer_and_export_finish(tmp_path, fault):
    rank, extra = FAULTS[fault]
    checkpointed = ["--checkpoint.enable_checkpoint", "--checkpoint.interval", "1"]
    if fault == "slow_shard_check":
        prepare([CORPUS], tmp_path / "shards", shard_mb=0.025, quiet=True)
        extra = [*extra, "--training.dataset_path", str(tmp_path / "shards")]
    args = _tiny(tmp_path, 3, 3, *checkpointed, "--checkpoint.timeout_seconds", "60", *extra)
    start = time.time()
    seconds = SHARD_SLOW if fault == "slow_shard_check" else SLOW
    proc = launch_worker(
        2, "fault_worker", args, FAULT=fault, FAULT_RANK=rank, FAULT_SECONDS=str(seconds)
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert time.time() - start > SLOW  # the fault did delay the run
    assert "training done: 3 steps" in proc.stderr
    if fault == "slow_export":
        assert (tmp_path / "checkpoint" / "hf-step-3" / "config.json").exists()
    if fault == "slow_shard_check":
        took = re.search(
            r"checked (\d+) items on 2 ranks: .* every rank's after ([\d.]+)s", proc.stderr
        )
        assert took and int(took[1]) == 9 and float(took[2]) >= 4 * SHARD_SLOW, took
    # After the first step every group but the checkpoint's has the training timeout, on every
    # rank; the checkpoint's keeps its own.
    ckpt_timeout = float(extra[-1]) if fault == "slow_export" else 60.0
    for r in (0, 1):
        timeouts = [t for _, t in json.loads((tmp_path / f"rank{r}_timeouts.json").read_text())]
        assert sorted(timeouts) == sorted([3.0] * (len(timeouts) - 1) + [ckpt_timeout]), timeouts


# 4 ranks, three 2 x 2 layouts: between them every kind of group a mesh builds, apart from the
# flattened ones that span all 4 ranks (torch reuses the default group for those).
STALL_LAYOUTS = {
    "hsdp": ["--parallelism.data_parallel_replicate_degree", "2"],
    "cp_tp": [
        "--parallelism.context_parallel_degree",
        "2",
        "--parallelism.tensor_parallel_degree",
        "2",
    ],
    "pp_fsdp": ["--parallelism.pipeline_parallel_degree", "2"],
}
GROUP_KINDS = {"dp_replicate", "dp_shard", "cp", "tp", "pp"}
INIT_TIMEOUT, STALL_TIMEOUT = 40, 2


@pytest.mark.slow
def test_a_stall_in_every_kind_of_mesh_group_times_out(tmp_path):
    """After step 1 each group's peers wait comm.train_timeout_seconds for a rank that stays
    away, not the start-up timeout nor torch's default: the timeout reaches every kind of group
    the meshes build (a timeout set on the default group alone fails here after 40 s)."""
    layouts = {
        name: [
            *_tiny(tmp_path / name, 1, STALL_TIMEOUT, *extra),
            "--model.n_layers",
            "2",
            "--comm.init_timeout_seconds",
            str(INIT_TIMEOUT),
            "--training.local_batch_size",
            "4",
        ]
        for name, extra in STALL_LAYOUTS.items()
    }
    out = tmp_path / "stalls.json"
    spawn(group_stall_worker.run, 4, layouts, str(out))
    records = json.loads(out.read_text())
    kinds = set()
    for name, stalls in records.items():
        for r in stalls:
            print(f"\n{name} {r['group']} {r['ranks']}: rank {r['rank']} waited {r['waited_s']} s")
            assert "Timed out" in r["ended"], r
            assert STALL_TIMEOUT <= r["waited_s"] < STALL_TIMEOUT + 6, r
            kinds.add(r["group"].removeprefix("mesh_"))
    assert GROUP_KINDS <= kinds, kinds
