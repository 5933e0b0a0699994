"""TensorBoard scalars, groups and step axis across a resume that trains steps again; goodput;
the eval scores; and a torch.profiler trace that parses. One process, no torchrun (the cheapest
real run)."""

import json
import shutil
import subprocess
import sys

import pytest
from helpers import DEBUG_CONFIG, ROOT, check, clean_env
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

GROUPS = {
    "loss/train",
    "throughput/tps",
    "throughput/tflops",
    "memory/peak_gib",
    "time/step_s",
    "time/data_loading_pct",
    "time/checkpoint_blocked_s",
    "optim/lr",
    "optim/grad_norm",
    "goodput/goodput_pct",
    "goodput/init_s",
    "goodput/redone_s",
    "goodput/eval_s",
    "time/eval_s",
}
EVAL_TAGS = {f"eval/titanlite_mc/{m}" for m in ("acc", "acc_norm", "acc_stderr", "acc_norm_stderr")}


def run(folder, steps: int, *extra: str) -> subprocess.CompletedProcess:
    return check(
        subprocess.run(
            [
                sys.executable,
                "-m",
                "titanlite.train",
                "--config",
                str(DEBUG_CONFIG),
                "--training.seq_len",
                "64",
                "--training.local_batch_size",
                "4",
                "--training.steps",
                str(steps),
                "--checkpoint.enable_checkpoint",
                "--checkpoint.interval",
                "2",
                "--job.dump_folder",
                str(folder),
                "--eval.enabled",
                "--eval.limit",
                "8",
                *extra,
            ],
            cwd=ROOT,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
    )


@pytest.mark.slow
def test_tensorboard_groups_resume_axis_goodput_and_profiler_trace(tmp_path):
    first = run(tmp_path, 4, "--profiling.enable_profiling", "--profiling.profile_freq", "2")
    assert "goodput " in first.stderr
    traces = sorted((tmp_path / "profile_trace").glob("iteration_*/rank0_trace.json"))
    assert [t.parent.name for t in traces] == ["iteration_2", "iteration_4"]  # every profile_freq
    for trace in traces:  # Perfetto / chrome://tracing format
        assert json.loads(trace.read_text())["traceEvents"]

    # Resume from step 2 although step 4 was reached: steps 3-4 are trained again.
    shutil.rmtree(tmp_path / "checkpoint" / "step-4")
    second = run(tmp_path, 6)
    assert "resuming at step 2" in second.stderr
    redone = float(second.stderr.split("goodput ")[1].split("redone ")[1].split("s")[0])
    assert redone > 0

    (folder,) = (tmp_path / "tb").glob("run-*")  # the resumed launch wrote into the same run
    events = EventAccumulator(str(folder))
    events.Reload()
    assert GROUPS | EVAL_TAGS <= set(events.Tags()["scalars"]), events.Tags()["scalars"]
    assert "config/text_summary" in events.Tags()["tensors"]
    losses = events.Scalars("loss/train")
    # Global step axis; the first launch's steps 3-4 were purged in favour of the re-done ones.
    assert [e.step for e in losses] == [1, 2, 3, 4, 5, 6]
    jsonl = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    last_of = {r["step"]: r["loss"] for r in jsonl}
    assert [e.value for e in losses] == pytest.approx([last_of[s] for s in range(1, 7)], rel=1e-6)
    # metrics.jsonl's key is the tag. Both launches scored their last step; TensorBoard purged
    # the first launch's step 4 with the steps it trained again.
    assert [r["step"] for r in jsonl if "eval/titanlite_mc/acc" in r] == [4, 6]
    for tag in EVAL_TAGS:
        assert [(e.step, e.value) for e in events.Scalars(tag)] == [
            (6, pytest.approx(jsonl[-1][tag], rel=1e-6))
        ]
