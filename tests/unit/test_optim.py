import math

import pytest
import torch

from titanlite.config_schema import LRScheduler, Optimizer
from titanlite.optim import build_optimizer, lr_factor


def test_warmup_stable_decay_linear():
    cfg = LRScheduler(warmup_steps=10, decay_ratio=0.5, decay_type="linear", lr_min=0.1)
    f = [lr_factor(s, 100, cfg) for s in range(100)]
    assert f[0] == pytest.approx(1 / 11) and f[9] == pytest.approx(10 / 11)
    assert all(x == 1.0 for x in f[10:50])  # stable phase
    assert f[50] < 1.0 and f[-1] == pytest.approx(0.1)  # decays to lr_min
    assert all(a >= b for a, b in zip(f[50:], f[51:]))


@pytest.mark.parametrize("kind", ["linear", "sqrt", "cosine"])
def test_decay_shapes_end_at_lr_min(kind):
    cfg = LRScheduler(warmup_steps=0, decay_type=kind, lr_min=0.0)
    f = [lr_factor(s, 20, cfg) for s in range(20)]
    assert f[-1] == pytest.approx(0.0, abs=1e-12)
    mid = lr_factor(9, 20, cfg)
    expected = {"linear": 0.5, "sqrt": 1 - math.sqrt(0.5), "cosine": 0.5}[kind]
    assert mid == pytest.approx(expected)


def test_short_run_shortens_decay_instead_of_failing():
    cfg = LRScheduler(warmup_steps=2, decay_ratio=0.8)
    f = [lr_factor(s, 5, cfg) for s in range(5)]
    assert f[2] < 1.0 and f[-1] == pytest.approx(0.0)


@pytest.mark.parametrize("impl", ["fused", "foreach", "for-loop"])
def test_adamw_groups_and_implementation(impl):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = build_optimizer(model, Optimizer(implementation=impl, weight_decay=0.1))
    assert isinstance(opt, torch.optim.AdamW)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(
        p.dim() < 2 for p in no_decay["params"]
    )
    assert decay["fused"] is (impl == "fused")
