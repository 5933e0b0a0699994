"""A pipeline schedule CSV checked against the layout before launch, every way it can be wrong
named by its row (parallelisms/pipeline_csv.py); the rows preflight accepts are the actions the
runtime runs."""

import pytest

from parallelisms import LayoutError
from parallelisms.pipeline_csv import read_schedule_csv

GPIPE = "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n"
ROW1 = "row 1 (pp rank 0)"


@pytest.mark.parametrize(
    "text",
    [
        GPIPE + "\n\n",  # trailing blank lines are no ranks
        "0F0,0F1,0I0,0W0,0B1\n1F0,1I0,1F1,1B1,1W0\n",  # split backward
        "0F0,0F1,,0B0,0B1\n1F0,(1F1;1B0)OVERLAP_F_B,1B1\n",  # an idle slot, a group
    ],
)
def test_schedules_the_runtime_runs_are_accepted(tmp_path, text):
    path = tmp_path / "s.csv"
    path.write_text(text)
    actions = read_schedule_csv(str(path), [[0], [1]], 2)
    assert sorted(actions) == [0, 1]
    assert str(actions[0][0]) == "0F0"


@pytest.mark.parametrize(
    "text, words",
    [
        ("5F0,5F1,5B0,5B1\n" + GPIPE.split("\n")[1], [ROW1, "'5F0' names stage 5", "stage 0"]),
        ("1F0,0F1,0B0,0B1\n" + GPIPE.split("\n")[1], [ROW1, "'1F0' names stage 1", "ids 0-1"]),
        (GPIPE.replace("0F1", "0F2"), [ROW1, "'0F2' names micro-batch 2", "ids 0-1"]),
        (GPIPE.replace("0F1", "0F1,0F1"), [ROW1, "runs 0F1 2 times", "exactly once"]),
        (GPIPE.replace(",0B1", ""), [ROW1, "stage 0, micro-batch 1 runs as 0 x 0B1"]),
        (GPIPE.replace("0F0,", "0UNSHARD,0F0,"), [ROW1, "'0UNSHARD'", "compute actions only"]),
        (GPIPE.replace("0F0", "0F"), [ROW1, "'0F' has no micro-batch number"]),
        (GPIPE.replace("0F0", "0F0x"), [ROW1, "'0F0x' is not an action"]),
        ("0F0,0B1,0F1,0B0\n1F0,1B0,1F1,1B1\n", [ROW1, "0B1 comes before 0F1"]),
        ("0F0,0F1,0W0,0I0,0B1\n1F0,1B0,1F1,1B1\n", [ROW1, "0W0 comes before 0I0"]),
        (
            "0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n",
            [ROW1, "action 2 (0B0) waits for 1B0", "wait for each other forever"],
        ),
        (GPIPE.split("\n")[0], ["1 row(s) of actions, one per pipeline rank expected (2)"]),
        ("0F0,0F1,0B0,0B1\n\n1F0,1B0,1F1,1B1\n", ["3 row(s) of actions"]),
    ],
    ids=[
        "no_such_stage",
        "other_ranks_stage",
        "microbatch",
        "twice",
        "no_backward",
        "not_compute",
        "no_microbatch",
        "garbage",
        "backward_first",
        "weight_first",
        "deadlock",
        "rows",
        "blank_row",
    ],
)
def test_a_bad_schedule_is_one_line_naming_the_file_and_row(tmp_path, text, words):
    path = tmp_path / "s.csv"
    path.write_text(text)
    with pytest.raises(LayoutError) as refused:
        read_schedule_csv(str(path), [[0], [1]], 2)
    line = str(refused.value)
    assert "\n" not in line and f"pipeline_parallel_schedule_csv = {path}" in line
    assert all(w in line for w in words), line


def test_stages_of_a_looped_layout_and_unreadable_files(tmp_path):
    path = tmp_path / "s.csv"
    path.write_text("0F0,2F0,2B0,0B0\n1F0,3F0,3B0,1B0\n")
    read_schedule_csv(str(path), [[0, 2], [1, 3]], 1)
    with pytest.raises(LayoutError, match="'2F0' names stage 2.* this row may name stage 0 or 3"):
        read_schedule_csv(str(path), [[0, 3], [1, 2]], 1)  # a V layout: rank 0 holds 0 and 3
    with pytest.raises(LayoutError, match="cannot read it"):
        read_schedule_csv(str(tmp_path / "missing.csv"), [[0], [1]], 1)
