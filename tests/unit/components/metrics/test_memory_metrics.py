"""memory_gib and memory_reserved_gib: the CUDA allocator's peaks since the last logged step, in
metrics.jsonl, TensorBoard and the console line; on CPU the peak RSS alone. The CUDA calls are
stood in for (no GPU here): what is checked is which figure goes where."""

import json
import logging

import pytest
import torch

from titanlite.components.metrics import logger as metrics
from titanlite.config.schema import Metrics

GIB = 2**30


@pytest.fixture
def fake_cuda(monkeypatch):
    """The allocator's peaks: 3 GiB allocated, 5 GiB reserved until reset_peak_memory_stats."""
    peaks = {"allocated": 3 * GIB, "reserved": 5 * GIB}

    def reset(device=None):
        peaks.update(allocated=GIB, reserved=2 * GIB)

    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: peaks["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d=None: peaks["reserved"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)


def _log_two_steps(tmp_path, device: torch.device, caplog) -> list[dict]:
    cfg = Metrics(log_freq=1, enable_tensorboard=True, peak_flops=1e15)
    log = metrics.MetricsLogger(
        cfg, tmp_path, device, True, 1, 1.0, 2, tb_dir=tmp_path / "tb", config_text=""
    )
    with caplog.at_level(logging.INFO):
        for step in (1, 2):
            log.count_step()
            log.log(step, 1.0, 1.0, 1e-3)
    log.close()
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def _tb_scalars(folder) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (run,) = [p for p in (folder / "tb").iterdir()]
    events = EventAccumulator(str(run))
    events.Reload()
    return {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_cuda_peaks_reach_jsonl_tensorboard_and_the_console(tmp_path, fake_cuda, caplog):
    rows = _log_two_steps(tmp_path, torch.device("cuda", 0), caplog)
    # Each logged step reports the peak since the previous one (the stats are reset).
    assert [(r["memory_gib"], r["memory_reserved_gib"]) for r in rows] == [(3.0, 5.0), (1.0, 2.0)]
    scalars = _tb_scalars(tmp_path)
    assert scalars["memory/peak_gib"] == [3.0, 1.0]
    assert scalars["memory/peak_reserved_gib"] == [5.0, 2.0]
    assert "mem 3.00GiB  (reserved 5.00GiB)" in caplog.text
    assert "mem 1.00GiB  (reserved 2.00GiB)" in caplog.text


def test_cpu_has_the_peak_rss_and_no_reserved_figure(tmp_path, caplog):
    rows = _log_two_steps(tmp_path, torch.device("cpu"), caplog)
    assert all(r["memory_gib"] > 0 and "memory_reserved_gib" not in r for r in rows)
    assert "memory/peak_reserved_gib" not in _tb_scalars(tmp_path)
    assert "reserved" not in caplog.text
