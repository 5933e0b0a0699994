import logging

import pytest
import torch

from titanlite.components.metrics import logger as metrics

CUDA = torch.device("cuda", 0)


# What torch.cuda.get_device_name() returns on each device (the driver's marketing name), and
# the dense bf16 peak the data sheet gives for it.
@pytest.mark.parametrize(
    "name, peak",
    [
        ("NVIDIA H100 80GB HBM3", 989.4e12),  # SXM5
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835.5e12),
        ("NVIDIA H200", 989.4e12),
        ("NVIDIA H200 NVL", 835.5e12),
        ("NVIDIA B200", 2.25e15),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A100-SXM4-40GB", 312e12),
        ("NVIDIA A100-PCIE-40GB", 312e12),
        ("NVIDIA A100 80GB PCIe", 312e12),
        ("NVIDIA L4", 121e12),
        ("NVIDIA L40", 181.05e12),
        ("NVIDIA L40S", 362.05e12),
        ("AMD Instinct MI300X", 1307.4e12),
        ("AMD Instinct MI250X", 191.5e12),
    ],
)
def test_peak_by_exact_device_name(monkeypatch, name, peak):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert metrics.peak_flops(CUDA, None) == peak


@pytest.mark.parametrize(
    "name", ["NVIDIA H100", "NVIDIA L4 Ti", "NVIDIA GeForce RTX 4090", "Tesla V100-SXM2-16GB"]
)
def test_unknown_device_has_no_peak_and_says_so(monkeypatch, caplog, name):
    # A fragment match would have given "NVIDIA H100" the SXM peak, the PCIe card's 30% too
    # high; an unknown name must give no MFU at all.
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    with caplog.at_level(logging.WARNING):
        assert metrics.peak_flops(CUDA, None) is None
    assert name in caplog.text and "metrics.peak_flops" in caplog.text


def test_override_wins_and_cpu_has_no_peak(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 PCIe")
    assert metrics.peak_flops(CUDA, 1e15) == 1e15
    assert metrics.peak_flops(torch.device("cpu"), None) is None
