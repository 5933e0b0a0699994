"""Pipeline-parallel checkpoints are the whole model's, under the whole model's names: a PP 2 x
FSDP 2 run resumes bit-exactly on its own layout and continues on one process, on FSDP 4 and on
PP 4 within 1e-4; a one-process checkpoint continues on PP 2 x TP 2."""

import pytest
from helpers import LAYOUTS, copy_step, losses_by_step, read_jsonl, train

from titanlite.components.checkpoint.storage import complete_steps

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
def saved_pp2_fsdp2(tmp_path_factory):
    folder = tmp_path_factory.mktemp("saved_pp2_fsdp2")
    nproc, args = PP_LAYOUTS["pp2_fsdp2"]
    train(nproc, folder, *args, *RUN)
    assert complete_steps(folder / "checkpoint") == [4, 8]
    for record in read_jsonl(folder / "metrics.jsonl"):  # each stage's peak memory is logged
        assert len(record["memory_gib_stages"]) == 2 and min(record["memory_gib_stages"]) > 0
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("target", ["pp2_fsdp2", "one", "fsdp4", "pp4"])
def test_pp2_fsdp2_checkpoint_resumes_on_its_layout_and_others(saved_pp2_fsdp2, tmp_path, target):
    copy_step(saved_pp2_fsdp2, 4, tmp_path)
    nproc, args = PP_LAYOUTS[target]
    proc = train(nproc, tmp_path, *args, *RUN)
    assert "resuming at step 4" in proc.stderr
    assert_continues(saved_pp2_fsdp2, tmp_path, exact=target == "pp2_fsdp2")


@pytest.mark.slow
def test_one_process_checkpoint_continues_on_pp2_tp2(tmp_path):
    one, target = tmp_path / "one", tmp_path / "target"
    train(1, one, *PP_LAYOUTS["one"][1], *RUN)
    copy_step(one, 4, target)
    nproc, args = PP_LAYOUTS["pp2_tp2"]
    train(nproc, target, *args, *RUN)
    assert_continues(one, target)
