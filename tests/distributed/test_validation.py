"""Training on prepared shards with validation losses on two named held-out sets
([[validation.sources]]: a text file, prepared shards), on gloo: training and validation losses,
each set's and the overall one, are the same on one process and on FSDP 2 x TP 2, PP 2 x FSDP 2
and CP 2 x FSDP 2 (these three in one process group), the text set's loss is the one
validation.dataset_path gives for it alone, and they reach metrics.jsonl and TensorBoard; a
corrupted shard stops the run at start, naming it."""

import subprocess
import sys

import pytest
from helpers import DEBUG_CONFIG, NO_EVAL, ROOT, check, clean_env, read_jsonl
from trainer_jobs import TrainerJobs

from titanlite.data.prepare import prepare

CORPUS = ROOT / "titanlite" / "assets" / "corpus"
HELD_OUT = CORPUS / "prose_01.txt"


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("shards")
    prepare([CORPUS], out, shard_mb=0.05, quiet=True)
    return out


@pytest.fixture(scope="module")
def config(tmp_path_factory, shards) -> str:
    """The debug preset with two named held-out sets: a text file and prepared shards."""
    path = tmp_path_factory.mktemp("config") / "validation.toml"
    sets = {"prose": HELD_OUT, "shards": shards}
    path.write_text(
        DEBUG_CONFIG.read_text()
        + "".join(
            f'\n[[validation.sources]]\nname = "{n}"\npath = "{p}"\n' for n, p in sets.items()
        )
    )
    return str(path)


def _args(folder, shards, config, *extra):
    """The run's arguments; its dump folder `folder` (None: left to TrainerJobs)."""
    return [
        "--config",
        config,
        *(["--job.dump_folder", str(folder)] if folder else []),
        "--training.dataset_path",
        str(shards),
        "--training.steps",
        "4",
        "--training.seq_len",
        "64",
        "--training.mixed_precision_param",
        "float32",
        "--training.deterministic",
        "--metrics.log_freq",
        "1",
        "--validation.enabled",
        "--validation.freq",
        "2",
        "--validation.steps",
        "2",
        *NO_EVAL,
        *extra,
    ]


def _one_process(args):
    return subprocess.run(
        [sys.executable, "-m", "titanlite.train", *args],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )


# metrics.jsonl key -> TensorBoard tag
TAGS = {
    "val_loss": "loss/validation",
    "val_loss_prose": "loss/validation/prose",
    "val_loss_shards": "loss/validation/shards",
}
KEYS = set(TAGS)
LBS8 = ("--training.local_batch_size", "8")
LAYOUTS = {
    "fsdp2_tp2": ["--training.local_batch_size", "4", "--parallelism.tensor_parallel_degree", "2"],
    # Validation through the pipeline schedule's forward-only eval.
    "pp2_fsdp2": [
        "--training.local_batch_size",
        "4",
        "--parallelism.pipeline_parallel_degree",
        "2",
    ],
    # Context parallel: each rank scores a part of every sequence; the loss and its token count
    # are summed over dp x cp.
    "cp2_fsdp2": [
        "--training.local_batch_size",
        "4",
        "--parallelism.context_parallel_degree",
        "2",
    ],
}


@pytest.mark.slow
def test_validation_losses_are_the_same_on_one_process_and_on_4_rank_layouts(
    shards, config, tmp_path
):
    one, single = tmp_path / "one", tmp_path / "single"
    check(_one_process(_args(one, shards, config, *LBS8)))
    # The same run with the text set alone, as validation.dataset_path: its loss is "prose".
    path = ["--validation.dataset_path", str(HELD_OUT)]
    check(_one_process(_args(single, shards, str(DEBUG_CONFIG), *path, *LBS8)))
    group = TrainerJobs(4, tmp_path)
    for name, extra in LAYOUTS.items():
        off = "--metrics.enable_tensorboard", "false"
        group.add(name, _args(None, shards, config, *extra, *off))
    group.run()
    for name in LAYOUTS:
        # Tokens seen count each sequence once, however many ranks share it (TP, PP, CP).
        assert group.result(name)["tokens_seen"] == 4 * 8 * 64, name
    val, train = {}, {}
    for name in ("one", *LAYOUTS):
        records = read_jsonl(tmp_path / name / "metrics.jsonl")
        val[name] = {(r["step"], k): r[k] for r in records for k in KEYS if k in r}
        train[name] = [r["loss"] for r in records]
        assert sorted(val[name]) == [(s, k) for s in (2, 4) for k in sorted(KEYS)], name
    # The shard reader gives every layout the same global batches, and validating in between
    # leaves training as it was.
    assert len(train["one"]) == 4
    for name in LAYOUTS:
        for ref, got in zip(train["one"], train[name]):
            assert abs(got - ref) <= 1e-4 * ref, (name, train)
        for at, ref in val["one"].items():
            assert abs(val[name][at] - ref) <= 1e-5 * ref, (name, at, val)
    loss = val["one"]
    alone = read_jsonl(single / "metrics.jsonl")
    assert [(r["step"], r["val_loss"]) for r in alone if "val_loss" in r] == [
        (s, loss[(s, "val_loss_prose")]) for s in (2, 4)
    ]
    for key in KEYS:  # it trained on something like the held-out sets
        assert loss[(4, key)] < loss[(2, key)], key
    # The overall loss is over both sets' targets together: between the two sets' losses.
    low, high = sorted((loss[(4, "val_loss_prose")], loss[(4, "val_loss_shards")]))
    assert low < loss[(4, "val_loss")] < high and high - low > 0.01

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (run,) = (one / "tb").glob("run-*")
    events = EventAccumulator(str(run))
    events.Reload()
    for key, tag in TAGS.items():
        assert [(e.step, pytest.approx(e.value)) for e in events.Scalars(tag)] == [
            (s, pytest.approx(loss[(s, key)])) for s in (2, 4)
        ], tag


@pytest.mark.slow
def test_corrupted_shard_stops_the_run_at_start(shards, config, tmp_path):
    import shutil

    bad = shutil.copytree(shards, tmp_path / "bad")
    data = bytearray((bad / "shard_00001.bin").read_bytes())
    data[10] ^= 0x01
    (bad / "shard_00001.bin").write_bytes(bytes(data))
    proc = _one_process(_args(tmp_path / "run", bad, config))
    assert proc.returncode != 0
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("titanlite: error:")]
    assert errors and f"{bad / 'shard_00001.bin'} is corrupted" in errors[0], proc.stderr[-3000:]
    assert "parameters" not in proc.stderr  # before the model was built
