"""Pipeline-parallel checkpoints are the whole model's, under the whole model's names: a PP 2 x
FSDP 2 run resumes bit-exactly on its own layout and continues on one process, on FSDP 4 and on
PP 4 within 1e-4; a one-process checkpoint continues on PP 2 x TP 2; runs under an interleaved
and a zero-bubble schedule (two stages per rank, each saved under its own layer names) resume
bit-exactly on their own layout and continue on one process."""

from pathlib import Path

import pytest
from helpers import CHECKPOINTED_RUN, LAYOUTS, copy_step, losses_by_step, read_jsonl
from trainer_jobs import TrainerJobs

from titanlite.components.checkpoint.folder import complete_steps

PP = ["--parallelism.pipeline_parallel_degree"]
PP_LAYOUTS = {
    "pp2_fsdp2": (4, ["--training.local_batch_size", "4", *PP, "2"]),
    "pp4": (4, ["--training.local_batch_size", "8", *PP, "4"]),
    "fsdp4": (4, ["--training.local_batch_size", "2"]),
    "pp2_tp2": (
        4,
        ["--training.local_batch_size", "8", *PP, "2", "--parallelism.tensor_parallel_degree", "2"],
    ),
    "one": LAYOUTS["one"],
}
PP_SCHEDULE = "--parallelism.pipeline_parallel_schedule"
for schedule in ("Interleaved1F1B", "ZBVZeroBubble"):
    PP_LAYOUTS[f"pp2_{schedule.lower()}"] = (
        2,
        ["--training.local_batch_size", "8", *PP, "2", PP_SCHEDULE, schedule],
    )
MULTI_STAGE = ["pp2_interleaved1f1b", "pp2_zbvzerobubble"]
RUN = ["--training.steps", "8", "--checkpoint.interval", "4"]


def assert_continues(reference, folder, exact: bool = False) -> None:
    want, got = losses_by_step(reference), losses_by_step(folder)
    assert sorted(got) == [5, 6, 7, 8]
    for s in got:
        if exact:
            assert got[s] == want[s], (s, got[s], want[s])
        else:
            assert abs(got[s] - want[s]) <= 1e-4 * want[s], (s, got[s], want[s])


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """{name: dump folder}: the saves (one process; PP 2 x FSDP 2, with the PP 2 x TP 2 resume
    of the one-process save), then the resumes of copies of PP 2 x FSDP 2's step 4, in one
    process group per world size and phase."""
    root = tmp_path_factory.mktemp("pipeline_checkpoints")
    folders: dict[str, Path] = {}
    phases = [
        (1, {"save_one": "one"}, {}),
        (4, {"save_pp2_fsdp2": "pp2_fsdp2"}, {"one_to_pp2_tp2": ("save_one", "pp2_tp2")}),
        (4, {}, {f"to_{t}": ("save_pp2_fsdp2", t) for t in ("pp2_fsdp2", "fsdp4", "pp4")}),
        (2, {f"save_{t}": t for t in MULTI_STAGE}, {}),
        (2, {}, {f"{t}_to_itself": (f"save_{t}", t) for t in MULTI_STAGE}),
        (
            1,
            {},
            {
                "to_one": ("save_pp2_fsdp2", "one"),
                **{f"{t}_to_one": (f"save_{t}", "one") for t in MULTI_STAGE},
            },
        ),
    ]
    for i, (nproc, saves, resumes) in enumerate(phases):
        group = TrainerJobs(nproc, root / f"phase{i}")
        group.folder.mkdir()
        for name, layout in saves.items():
            folders[name] = group.add(name, [*CHECKPOINTED_RUN, *PP_LAYOUTS[layout][1], *RUN])
        for name, (src, layout) in resumes.items():
            folders[name] = group.add(name, [*CHECKPOINTED_RUN, *PP_LAYOUTS[layout][1], *RUN])
            copy_step(folders[src], 4, folders[name])
        group.run()
        for name in group.jobs:
            assert group.result(name)["resumed_from"] == (4 if name in resumes else None)
    return folders


@pytest.mark.slow
def test_pipeline_stages_save_and_log_their_memory(runs):
    folder = runs["save_pp2_fsdp2"]
    assert complete_steps(folder / "checkpoint") == [4, 8]
    for record in read_jsonl(folder / "metrics.jsonl"):  # each stage's peak memory is logged
        assert len(record["memory_gib_stages"]) == 2 and min(record["memory_gib_stages"]) > 0


@pytest.mark.slow
@pytest.mark.parametrize("target", ["pp2_fsdp2", "one", "fsdp4", "pp4"])
def test_pp2_fsdp2_checkpoint_resumes_on_its_layout_and_others(runs, target):
    assert_continues(runs["save_pp2_fsdp2"], runs[f"to_{target}"], exact=target == "pp2_fsdp2")


@pytest.mark.slow
def test_one_process_checkpoint_continues_on_pp2_tp2(runs):
    assert_continues(runs["save_one"], runs["one_to_pp2_tp2"])


@pytest.mark.slow
@pytest.mark.parametrize("layout", MULTI_STAGE)
def test_multi_stage_schedules_resume_exactly_and_continue_on_one_process(runs, layout):
    assert_continues(runs[f"save_{layout}"], runs[f"{layout}_to_itself"], exact=True)
    assert_continues(runs[f"save_{layout}"], runs[f"{layout}_to_one"])
