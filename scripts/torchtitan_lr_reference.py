"""The reference LR rows of tests/unit/components/test_optim.py, computed by TorchTitan's own
scheduler: for each (total steps, [lr_scheduler] keys), the LR its LRSchedulersContainer gives at
each step, relative to the peak, read back from the optimizer as TorchTitan's loop uses it.

    python scripts/torchtitan_lr_reference.py          # in a venv with torchtitan installed
    python scripts/torchtitan_lr_reference.py --check  # exit 1 if the test's rows differ

The venv of ../shared/tools/torchtitan_cpu (`pip install torch==2.13.0 torchtitan==0.3.0`) has
what it needs; of titanlite only its argument parser (standard library alone) is imported, from
this checkout, so any such venv will do.
"""

from __future__ import annotations

import ast
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from titanlite.core.arguments import ArgumentParser  # noqa: E402

TEST = ROOT / "tests" / "unit" / "components" / "test_optim.py"

# (total steps, [lr_scheduler] keys in titanlite's spelling); the first is TorchTitan's
# llama3_debugmodel recipe over 20 steps, the last three shorten a decay or warmup too long for
# the run.
SCHEDULES: list[tuple[int, dict]] = [
    (20, dict(warmup_steps=2, decay_ratio=0.8, decay_type="linear")),
    (10, dict(warmup_steps=3, decay_type="cosine", lr_min=0.1)),
    (8, dict(warmup_steps=2, decay_ratio=0.5, decay_type="sqrt")),
    (5, dict(warmup_steps=2, decay_ratio=0.8)),
    (5, dict(warmup_steps=8)),
    (5, dict(warmup_steps=0)),
]


def torchtitan_lrs(total: int, keys: dict) -> list[float]:
    import torch
    from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer

    theirs = {("min_lr_factor" if k == "lr_min" else k): v for k, v in keys.items()}
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedulers = LRSchedulersContainer.Config(**theirs).build(
        optimizers=[optimizer], training_steps=total
    )
    lrs = []
    for _ in range(total):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedulers.step()
    return lrs


def rows_in_test() -> list[tuple[int, dict, list[float]]]:
    """TORCHTITAN_SCHEDULES as the test file writes it (read, not imported: no titanlite)."""
    for node in ast.parse(TEST.read_text()).body:
        if isinstance(node, ast.Assign) and node.targets[0].id == "TORCHTITAN_SCHEDULES":  # type: ignore[attr-defined]
            return eval(compile(ast.Expression(node.value), str(TEST), "eval"))  # noqa: S307
    raise SystemExit(f"TORCHTITAN_SCHEDULES not found in {TEST}")


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the test's rows")
    args = parser.parse_args(argv)
    computed = [(total, keys, torchtitan_lrs(total, keys)) for total, keys in SCHEDULES]
    for total, keys, lrs in computed:
        print(f"({total}, {keys!r}, {lrs!r}),")
    if not args.check:
        return 0
    written = rows_in_test()
    same = len(written) == len(computed) and all(
        (t, k) == (t2, k2)
        and all(math.isclose(a, b, rel_tol=1e-12) for a, b in zip(lrs, lrs2))
        and len(lrs) == len(lrs2)
        for (t, k, lrs), (t2, k2, lrs2) in zip(written, computed)
    )
    print("the test's rows are TorchTitan's" if same else f"{TEST} differs from the rows above")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
