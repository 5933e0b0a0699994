import math
import sys

import pytest
import torch
from helpers import ROOT

from titanlite.components.optim import build_lr_scheduler, build_optimizer, lr_factor
from titanlite.config.schema import LRScheduler, Optimizer

# TorchTitan 0.3.0's own LRSchedulersContainer (LambdaLR), read back from the optimizer at each
# of the steps, as printed by `python scripts/torchtitan_lr_reference.py` in a venv with
# torchtitan==0.3.0 (`--check` compares them with these). (total steps, [lr_scheduler] keys, LRs
# relative to the peak.) The first row is TorchTitan's llama3_debugmodel recipe over 20 steps.
TORCHTITAN_SCHEDULES = [
    (
        20,
        dict(warmup_steps=2, decay_ratio=0.8, decay_type="linear"),
        [
            0.5,
            1.0,
            1.0,
            1.0,
            1.0,
            0.9375,
            0.875,
            0.8125,
            0.75,
            0.6875,
            0.625,
            0.5625,
            0.5,
            0.4375,
            0.375,
            0.3125,
            0.25,
            0.1875,
            0.125,
            0.0625,
        ],
    ),
    (
        10,
        dict(warmup_steps=3, decay_type="cosine", lr_min=0.1),
        [
            1 / 3,
            2 / 3,
            1.0,
            1.0,
            0.9554359905560885,
            0.8305704108364301,
            0.6501344202803414,
            0.44986557971965857,
            0.26942958916356996,
            0.14456400944391146,
        ],
    ),
    (
        8,
        dict(warmup_steps=2, decay_ratio=0.5, decay_type="sqrt"),
        [0.5, 1.0, 1.0, 1.0, 1.0, 0.5, 0.2928932188134524, 0.1339745962155614],
    ),
    # Too long a decay, then too long a warmup, for the run: both are shortened.
    (5, dict(warmup_steps=2, decay_ratio=0.8), [0.5, 1.0, 1.0, 2 / 3, 1 / 3]),
    (5, dict(warmup_steps=8), [0.2, 0.4, 0.6, 0.8, 1.0]),
    (5, dict(warmup_steps=0), [1.0, 0.8, 0.6, 0.4, 0.2]),
]


def test_the_reference_rows_are_the_schedules_the_script_computes():
    """Where torchtitan is installed, the script recomputes the rows (else that half skips)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from torchtitan_lr_reference import SCHEDULES, main

    assert [(total, keys) for total, keys, _ in TORCHTITAN_SCHEDULES] == SCHEDULES
    pytest.importorskip("torchtitan.components.optimizer.lr_scheduler")
    assert main(["--check"]) == 0


@pytest.mark.parametrize("total, keys, expected", TORCHTITAN_SCHEDULES)
def test_schedule_equals_torchtitans_at_every_step(total, keys, expected):
    cfg = LRScheduler(**keys)
    assert [lr_factor(s, total, cfg) for s in range(total)] == pytest.approx(expected, rel=1e-12)


def test_the_scheduler_applies_the_factor_to_the_lr_of_each_step():
    model = torch.nn.Linear(2, 2)
    opt = build_optimizer(model, Optimizer(lr=8e-4))
    sched = build_lr_scheduler(opt, LRScheduler(warmup_steps=2, decay_ratio=0.8), 20)
    used = []
    for _ in range(20):
        used.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert used == pytest.approx([8e-4 * f for f in TORCHTITAN_SCHEDULES[0][2]], rel=1e-12)


@pytest.mark.parametrize("kind", ["linear", "sqrt", "cosine"])
def test_decay_shapes_approach_lr_min(kind):
    cfg = LRScheduler(warmup_steps=0, decay_type=kind, lr_min=0.25)
    f = [lr_factor(s, 40, cfg) for s in range(40)]
    assert f[0] == 1.0 and all(a > b for a, b in zip(f, f[1:]))
    # One virtual step past the end: the last step is one decay step short of lr_min.
    progress = 39 / 40
    shape = {"linear": 1 - progress, "sqrt": 1 - math.sqrt(progress)}.get(
        kind, 0.5 * (1 + math.cos(math.pi * progress))
    )
    assert f[-1] == pytest.approx(0.25 + 0.75 * shape) and f[-1] > 0.25


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
