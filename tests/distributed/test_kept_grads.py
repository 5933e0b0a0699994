"""FSDP2's unsharded gradients kept between micro-batches when
parallelism.fsdp_sync_grads_each_microbatch = false: in the dry run's table (only then), the
same figure as a real gloo run keeps, and one warning line in the dry run and in preflight."""

import json

import pytest
from helpers import TINY_RUN, dry_run, preflight, spawn
from kept_grads_worker import write_kept_bytes, write_pipeline_kept_bytes

from titanlite.config import loader as config
from titanlite.planning.dry_run import KEPT_GRADS, plan

GIB = 2**30
NO_SYNC = ["--parallelism.fsdp_sync_grads_each_microbatch", "false"]
LLAMA_8B_PARAMS = 8_030_261_248


def _plan(*args: str, world: int = 8):
    return plan(config.load(["--config", "llama_8b.toml", *args]), world)


def test_every_unsharded_gradient_counts_in_the_reduce_dtype():
    # 4 micro-batches on FSDP 8: all 8.03B parameters' gradients, unsharded, in float32.
    accum = ["--training.global_batch_size", "32"]
    p = _plan(*accum, *NO_SYNC)
    assert p.bytes[KEPT_GRADS] == LLAMA_8B_PARAMS * 4
    # Not divided by data parallelism, which is what makes it a surprise.
    assert _plan("--training.global_batch_size", "256", *NO_SYNC, world=64).bytes[KEPT_GRADS] == (
        LLAMA_8B_PARAMS * 4
    )
    # bfloat16 reduce: 2 bytes each. Under TP 2 a rank's shards: half, less the replicated norms.
    assert _plan(*accum, *NO_SYNC, "--training.mixed_precision_reduce", "bfloat16").bytes[
        KEPT_GRADS
    ] == (LLAMA_8B_PARAMS * 2)
    tp2 = _plan(
        "--training.global_batch_size", "16", *NO_SYNC, "--parallelism.tensor_parallel_degree", "2"
    )
    norms = (32 * 2 + 1) * 4096
    assert tp2.bytes[KEPT_GRADS] == ((LLAMA_8B_PARAMS - norms) // 2 + norms) * 4
    assert p.total - p.bytes[KEPT_GRADS] == _plan(*accum).total


@pytest.mark.parametrize(
    "args",
    [
        ["--training.global_batch_size", "32"],  # syncing every micro-batch (the default)
        NO_SYNC,  # one micro-batch: nothing to keep between micro-batches
    ],
)
def test_not_counted_when_nothing_is_kept(args):
    p = _plan(*args)
    assert KEPT_GRADS not in p.bytes and not p.warnings


def test_pipeline_stages_keep_them_whatever_the_option():
    # torch's pipeline schedule syncs once per step (PipelineStage.perform_reduce_grad), so a
    # stage keeps its unsharded gradients with the option's default and one micro-batch of
    # gradient accumulation too. No warning: the option does not change it.
    pp = ["--parallelism.pipeline_parallel_degree", "2", "--training.local_batch_size", "2"]
    first, last = (plan(config.load(["--config", "llama_8b.toml", *pp]), 8, rank=r) for r in (0, 4))
    assert first.bytes[KEPT_GRADS] + last.bytes[KEPT_GRADS] == LLAMA_8B_PARAMS * 4
    assert not first.warnings


def test_one_warning_line_in_the_dry_run_and_in_preflight():
    line = (
        "titanlite: warning: parallelism.fsdp_sync_grads_each_microbatch = false with 4 "
        "micro-batches keeps every parameter's unsharded float32 gradient between them: 29.92 "
        "GiB more per rank; --parallelism.fsdp_sync_grads_each_microbatch true (a reduce-scatter "
        "per micro-batch) avoids it"
    )
    proc = dry_run(
        "--config",
        "llama_8b.toml",
        "--dry-run.world_size",
        "8",
        "--training.global_batch_size",
        "32",
        *NO_SYNC,
    )
    assert proc.returncode == 0 and proc.stderr.strip() == line
    assert f"{KEPT_GRADS:<36}     29.92 GiB" in proc.stdout
    assert "biggest item: FSDP unsharded grads (accumulation); " in proc.stdout
    # Preflight, before a real launch: the same line, from the parameter count.
    proc = preflight(["--training.global_batch_size", "8", *NO_SYNC], NGPU="2")
    assert proc.returncode == 0, proc.stderr
    (warning,) = [w for w in proc.stderr.splitlines() if "fsdp_sync_grads_each_microbatch" in w]
    assert warning.startswith(
        "titanlite: warning: parallelism.fsdp_sync_grads_each_microbatch = false with 2 "
        "micro-batches keeps every parameter's unsharded float32 gradient between them: "
    )
    assert "fsdp_sync" not in preflight(["--training.global_batch_size", "8"], NGPU="2").stderr


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_the_dry_run_counts_what_a_real_run_keeps(tmp_path, param_dtype):
    # Two gloo ranks, FSDP 2, two micro-batches. In float32, FSDP leaves each gradient on the
    # unsharded parameter; with bfloat16 compute it keeps a float32 copy instead (torch's
    # to_accumulated_grad_if_needed): the same bytes, by two paths.
    args = [
        *TINY_RUN,
        "--training.local_batch_size",
        "2",
        "--training.global_batch_size",
        "8",
        "--training.mixed_precision_param",
        param_dtype,
        "--job.dump_folder",
        str(tmp_path),
        *NO_SYNC,
    ]
    spawn(write_kept_bytes, 2, str(tmp_path / "kept"), args)
    job = config.load(args)
    for rank in range(2):
        real = json.loads((tmp_path / f"kept.rank{rank}.json").read_text())
        predicted = plan(job, 2, rank=rank, device_type="cpu").bytes
        assert real["unsynced"] == predicted[KEPT_GRADS], (rank, real, predicted[KEPT_GRADS])
        # After the last micro-batch's reduce-scatter only the sharded gradients are left.
        assert real["synced"] == predicted["gradients"], (rank, real)


def test_pipeline_stages_keep_what_the_dry_run_counts(tmp_path):
    # PP 2 x FSDP 2 on four gloo ranks, four pipeline micro-batches, the option at its default.
    # Before the stage's reduce-scatter: the stage's unsharded gradients, plus the pipeline's
    # activation-sized buffers (64 KiB per micro-batch's hidden states here; not gradients).
    # All 6 blocks: with TINY_RUN's 2, those buffers are 5% of a stage's gradients, not < 2%.
    args = [
        *TINY_RUN,
        *("--model.n_layers", "6"),
        *("--training.local_batch_size", "4", "--parallelism.pipeline_parallel_degree", "2"),
        *("--job.dump_folder", str(tmp_path)),
    ]
    spawn(write_pipeline_kept_bytes, 4, str(tmp_path / "kept"), args)
    job = config.load(args)
    for rank in range(4):
        (real,) = json.loads((tmp_path / f"kept.rank{rank}.json").read_text())["before_reduce"]
        kept = plan(job, 4, rank=rank, device_type="cpu").bytes[KEPT_GRADS]
        assert kept <= real <= kept * 1.02, (rank, real, kept)
