"""Bad input, round two (issue 31) through ./run_train.sh: a pipeline schedule CSV that does not
fit the layout, pipeline splits with a stage that holds no block or fewer blocks than
layers_per_stage asks, a run that skipped its steps for non-finite values, and bfloat16 on a CPU
that emulates it. What preflight alone decides also runs in this process (helpers.preflight);
each case has one run through the shell script (exit code and last line)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import expect_one_line, in_pairs, last_line, preflight, read_jsonl, run_train

from titanlite.components.checkpoint.folder import complete_steps
from titanlite.components.checkpoint.storage import load_full_state_dict
from titanlite.preflight import bf16

PP2 = ["--parallelism.pipeline_parallel_degree", "2"]
CSV = "--parallelism.pipeline_parallel_schedule_csv"
GPIPE = "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n"  # 2 stages, 2 micro-batches (local batch 2)
BF16 = ["--training.mixed_precision_param", "bfloat16"]
WARNING = "titanlite: warning: training.mixed_precision_param = 'bfloat16' is emulated"


def csv_file(folder: Path, name: str, text: str) -> str:
    path = folder / f"{name}.csv"
    path.write_text(text)
    return str(path)


def test_schedule_csv_checked_against_the_layout_in_preflight(tmp_path):
    dump = ["--job.dump_folder", str(tmp_path / "out")]
    cases = {
        "microbatch": GPIPE.replace("1F1", "1F2"),
        "deadlock": "0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n",
        "unshard": GPIPE.replace("0F0,", "0UNSHARD,0F0,"),
    }
    got = {
        name: preflight([*dump, *PP2, CSV, csv_file(tmp_path, name, text)], NGPU="2")
        for name, text in cases.items()
    }
    row2 = f"{CSV[2:]} = {tmp_path / 'microbatch.csv'}: row 2 (pp rank 1)"
    expect_one_line(got["microbatch"], 2, row2, "'1F2' names micro-batch 2; there are 2, ids 0-1")
    expect_one_line(got["deadlock"], 2, "row 1 (pp rank 0): action 2 (0B0) waits for 1B0")
    expect_one_line(got["unshard"], 2, "'0UNSHARD': the CSV runtime takes compute actions only")
    # The layout decides: a good file for a local batch of 2 misses micro-batches 2 and 3 of 4.
    good = csv_file(tmp_path, "good", GPIPE)
    assert preflight([*dump, *PP2, CSV, good], NGPU="2").returncode == 0
    four = preflight([*dump, *PP2, CSV, good, "--training.local_batch_size", "4"], NGPU="2")
    expect_one_line(four, 2, "row 1 (pp rank 0): runs 0F2 0 times", "exactly once")


@pytest.mark.slow
def test_bad_pipeline_input_and_odd_splits_through_run_train(tmp_path):
    """The issue's CSV (stage 5 of 2) stops in preflight; the splits it asked about train, and
    the log says what each stage holds (test_layout_parity.py shows they train the same model
    as one process)."""
    stage5 = csv_file(tmp_path, "stage5", "5F0,5F1,5B0,5B1\n1F0,1B0,1F1,1B1\n")
    ngpu2 = {"NGPU": "2"}
    got = in_pairs(
        {
            "stage5": (["--job.dump_folder", str(tmp_path / "a"), *PP2, CSV, stage5], ngpu2),
            "lps3": (
                ["--job.dump_folder", str(tmp_path / "b"), *PP2, "--model.n_layers", "2"]
                + ["--parallelism.pipeline_parallel_layers_per_stage", "3"],
                ngpu2,
            ),
            # In emulated bfloat16 too (oneDNN held to AVX2, whatever the CPU): the warning
            # comes once, from preflight, not from each rank, and the run goes on.
            "one_block": (
                ["--job.dump_folder", str(tmp_path / "c"), *PP2, "--model.n_layers", "1", *BF16],
                {**ngpu2, "ONEDNN_MAX_CPU_ISA": "AVX2"},
            ),
        }
    )
    expect_one_line(
        got["stage5"],
        2,
        f"titanlite: error: {CSV[2:]} = {stage5}: row 1 (pp rank 0): '5F0' names stage 5",
        "this row may name stage 0 (the layout has 2 stages, ids 0-1)",
    )
    assert "Traceback" not in got["stage5"].stderr and "KeyError" not in got["stage5"].stderr
    holds = {
        "lps3": "2 stages = ceil((2 + 1 + 1) / pipeline_parallel_layers_per_stage 3) (1 per "
        "rank): embedding + block 0 | block 1 + norm + output;",
        "one_block": "2 stages (1 per rank): embedding + block 0 | norm + output;",
    }
    for name, words in holds.items():
        proc = got[name]
        assert proc.returncode == 0 and "goodput" in last_line(proc), proc.stderr[-3000:]
        assert words in proc.stderr, proc.stderr[-3000:]
    warnings = [ln for ln in got["one_block"].stderr.splitlines() if "titanlite: warning" in ln]
    assert len(warnings) == 1 and warnings[0].startswith(WARNING), warnings
    assert "(ONEDNN_MAX_CPU_ISA=AVX2 keeps oneDNN" in warnings[0]
    assert "pass --training.mixed_precision_param float32" in warnings[0]
    assert "titanlite: warning" not in got["lps3"].stderr  # float32


@pytest.mark.slow
def test_a_run_that_skipped_its_steps_fails_and_keeps_its_good_checkpoint(tmp_path):
    # The run: lr 1e6 turns the gradient norm NaN from step 3 on; every later update is
    # skipped (skip_nonfinite_steps 1000), so 6 of 8 are, the last among them.
    proc = run_train(
        ["--job.dump_folder", str(tmp_path), "--training.skip_nonfinite_steps", "1000"]
        + ["--optimizer.lr", "1e6", "--training.steps", "8", "--metrics.log_freq", "1"]
        + ["--checkpoint.enable_checkpoint", "--checkpoint.interval", "1"]
    )
    expect_one_line(
        proc,
        3,
        "titanlite: error: 6 of 8 step(s) skipped for a non-finite gradient norm, the last one "
        "(step 8) among them: training failed",
    )
    # Steps 1 and 2 were good and saved; none from step 3 on, the final step's included: the
    # latest checkpoint is step 2's, finite.
    assert complete_steps(tmp_path / "checkpoint") == [1, 2]
    assert not any((tmp_path / "checkpoint").glob("*.partial"))
    saved = load_full_state_dict(tmp_path / "checkpoint" / "step-2", ["model"])["model"]
    assert all(bool(t.isfinite().all()) for t in saved.values())
    assert [r["skipped_steps"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [
        0,
        0,
        *range(1, 7),
    ]


def test_bf16_warning_iff_this_cpu_emulates_it(tmp_path):
    dump = ["--job.dump_folder", str(tmp_path)]
    emulated = bf16.emulated_bf16(bf16.cpu_flags(), dict(os.environ))
    proc = preflight([*dump, *BF16])
    assert proc.returncode == 0 and (WARNING in proc.stderr) == bool(emulated), proc.stderr
    assert WARNING not in preflight([*dump, "--training.mixed_precision_param", "float32"]).stderr
