"""Expert parallel's token dispatch (parallelisms/expert_parallel.py) against one process, on a
real gloo group of 2 and of 4 ranks: every rank routes its own tokens (different on each, and
unevenly over the experts, so the all-to-all's splits are uneven and one expert gets none)
through the same MoE, its experts split over the ranks. Each rank's output, its input's
gradient and its experts' weight gradients (summed over every rank's tokens) must equal one
process's computation of the same tokens through the unsplit MoE, within 1e-6, with the same
experts chosen."""

import json
from pathlib import Path

import pytest
import torch
from helpers import spawn

DIM, EXPERTS, TOKENS = 16, 8, 24


def _moe():
    from models.moe import MoE, MoEArgs

    torch.manual_seed(0)
    args = MoEArgs(num_experts=EXPERTS, top_k=2, hidden_dim=8, load_balance="none")
    moe = MoE(DIM, args)
    for p in moe.parameters():
        p.data.normal_(0, 0.5)
    # Expert 5 is never chosen (every token's feature 0 is large, its router row weighs that
    # feature down), so one expert's split is empty.
    moe.router.gate.weight.data[5] = 0.0
    moe.router.gate.weight.data[5, 0] = -10.0
    return moe


def _tokens(rank: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(TOKENS + 4 * rank, DIM, generator=generator)  # other lengths per rank
    x[:, 0] = 5.0
    return x


def _run(moe, x):
    x = x.clone().requires_grad_()
    chosen = moe.router(x)[1]
    out = moe(x)
    (out * torch.arange(out.numel()).view_as(out).cos()).sum().backward()
    return out.detach(), x.grad, chosen


def _worker(rank: int, world_size: int, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from parallelisms.expert_parallel import apply_ep

    reference = _moe()
    split = _moe()
    apply_ep(split, init_device_mesh("cpu", (world_size,), mesh_dim_names=("ep",)))
    want_out, want_grad, want_chosen = _run(reference, _tokens(rank))
    for other in range(world_size):  # the unsplit experts' gradients from every rank's tokens
        if other != rank:
            _run(reference, _tokens(other))
    got_out, got_grad, got_chosen = _run(split, _tokens(rank))
    errors = {"output": _error(got_out, want_out), "input grad": _error(got_grad, want_grad)}
    local = EXPERTS // world_size
    for name in ("w13", "w2"):
        got = getattr(split.experts, name).grad.to_local()
        want = getattr(reference.experts, name).grad[rank * local : (rank + 1) * local]
        errors[f"{name} grad"] = _error(got, want)
    errors["chosen equal"] = float(torch.equal(got_chosen, want_chosen))
    counts = torch.bincount(want_chosen.flatten(), minlength=EXPERTS).tolist()
    Path(f"{out}.{rank}").write_text(json.dumps({"errors": errors, "counts": counts}))


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm() / want.norm()).item()


@pytest.mark.parametrize("world_size", [2, 4])
def test_dispatch_and_its_backward_equal_one_process(tmp_path, world_size):
    out = tmp_path / "result"
    spawn(_worker, world_size, str(out))
    for rank in range(world_size):
        result = json.loads(Path(f"{out}.{rank}").read_text())
        errors = result["errors"]
        print(f"\nEP {world_size} rank {rank}: {errors}, tokens per expert {result['counts']}")
        assert errors.pop("chosen equal") == 1.0
        assert result["counts"][5] == 0 and len(set(result["counts"])) > 2  # uneven, one empty
        assert all(e <= 1e-6 for e in errors.values()), errors
