"""Reading TorchTitan's console log (tests/fixtures/torchtitan_logs: the step lines of a real
TorchTitan 0.3.0 run of its debugmodel recipe on CPU, seed 42, made with
../shared/tools/torchtitan_cpu/torchtitan_cpu.sh)."""

import pytest
from helpers import ROOT

from titanlite.tools.torchtitan_log import is_torchtitan_log, read_torchtitan_log

LOG = ROOT / "tests" / "fixtures" / "torchtitan_logs" / "debugmodel_cpu_seed42.log"


def test_every_step_line_becomes_a_record_with_titanlites_keys():
    records = read_torchtitan_log(LOG)
    assert list(records) == list(range(1, 21))
    assert records[4] == {
        "step": 4,
        "loss": 5.79904,
        "grad_norm": 2.605,
        "memory_gib": 3.54,
        "tps": 2540.0,
        "tflops": 0.18,
        "mfu": 0.06,
    }
    assert records[20]["loss"] == 2.87611


def test_colours_validation_lines_and_a_relaunch(tmp_path):
    lines = LOG.read_text().splitlines()
    step4 = next(line for line in lines if "step:  4 " in line)
    # TorchTitan's colour codes around each field (its default, without
    # --metrics.disable-color-printing), a validation line, and step 4 logged again by a
    # relaunch from a checkpoint with another loss.
    coloured = step4.replace("step:", "\x1b[31mstep:").replace("loss:", "\x1b[32mloss:")
    validation = (
        "[rank0]:[titan] 2026-12-01 10:50:14,000 - root - INFO - \x1b[33mvalidate step:  4  "
        "\x1b[32mloss:  5.1234  \x1b[39mmemory:  3.54GiB(15.02%)  \x1b[34mtps: 9,999\x1b[39m"
    )
    relaunch = step4.replace("5.79904", "5.70000")
    path = tmp_path / "train.log"
    path.write_text("\n".join([coloured, validation, relaunch]) + "\n")
    assert is_torchtitan_log(path)
    (record,) = read_torchtitan_log(path).values()
    assert record["loss"] == 5.7 and record["val_loss"] == 5.1234 and record["tps"] == 2540.0


@pytest.mark.parametrize("text", ['{"step": 1, "loss": 7.9}\n', "loss: 3.0 at step: 4\n", ""])
def test_other_files_are_not_taken_for_a_torchtitan_log(tmp_path, text):
    path = tmp_path / "metrics.jsonl"
    path.write_text(text)
    assert not is_torchtitan_log(path)
