"""The one resume rule (components/checkpoint/resume.py) that preflight and CheckpointManager.load
share: checkpoint.load_step, else the latest complete step, else checkpoint.initial_load_path."""

import pytest
from helpers import DEBUG_CONFIG

from titanlite.components.checkpoint.folder import MANIFEST, CheckpointError
from titanlite.components.checkpoint.resume import resume_point
from titanlite.config.loader import load
from titanlite.preflight.checkpoint import checkpoint_to_load


def job(tmp_path, *extra: str):
    return load(["--config", str(DEBUG_CONFIG), "--job.dump_folder", str(tmp_path), *extra])


def make_steps(folder, *steps: int) -> None:
    for s in steps:
        (folder / f"step-{s}").mkdir(parents=True)
        (folder / f"step-{s}" / MANIFEST).write_text("{}")
    (folder / ".step-9.partial").mkdir()  # an unfinished save: never resumed from
    (folder / "step-8").mkdir()  # no manifest: incomplete


def test_latest_complete_step_then_load_step_then_initial_load_path(tmp_path):
    folder = tmp_path / "checkpoint"
    on = ("--checkpoint.enable_checkpoint",)
    assert resume_point(job(tmp_path, *on).checkpoint, folder) is None  # a fresh start
    initial = ("--checkpoint.initial_load_path", str(tmp_path / "seed"))
    point = resume_point(job(tmp_path, *on, *initial).checkpoint, folder)
    assert point is not None and (point.path, point.step) == (tmp_path / "seed", None)

    make_steps(folder, 2, 10, 4)
    point = resume_point(job(tmp_path, *on, *initial).checkpoint, folder)
    assert point is not None
    assert (point.path, point.step, point.complete) == (folder / "step-10", 10, [2, 4, 10])
    assert checkpoint_to_load(job(tmp_path, *on)) == point

    point = resume_point(job(tmp_path, *on, "--checkpoint.load_step", "4").checkpoint, folder)
    assert point is not None and (point.path, point.step) == (folder / "step-4", 4)
    assert checkpoint_to_load(job(tmp_path, *on, "--checkpoint.load_step", "4")) == point

    assert resume_point(job(tmp_path).checkpoint, folder) is None  # checkpointing off
    assert checkpoint_to_load(job(tmp_path)) is None


def test_load_step_that_is_not_complete_names_the_complete_ones(tmp_path):
    folder = tmp_path / "checkpoint"
    make_steps(folder, 1)
    for step in ("7", "8"):
        j = job(tmp_path, "--checkpoint.enable_checkpoint", "--checkpoint.load_step", step)
        with pytest.raises(CheckpointError) as e:
            checkpoint_to_load(j)
        assert str(e.value) == (
            f"checkpoint.load_step = {step}: {folder / f'step-{step}'} is not a complete "
            "checkpoint (complete: [1])"
        )
