"""The optimizer's checkpoint form: flattened (one key per parameter and hyperparameter, which
pipeline stages need), and checkpoints written before in the nested form still load."""

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from titanlite.components.checkpoint.states import (
    OptimizerState,
    optimizer_saved_flattened,
    plain_tensors,
)
from titanlite.components.checkpoint.storage import read_metadata


def _trained() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    opt = torch.optim.AdamW(
        [
            {"params": [model[0].weight, model[1].weight], "weight_decay": 0.1},
            {"params": [model[0].bias, model[1].bias], "weight_decay": 0.0},
        ],
        lr=1e-2,
    )
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    return model, opt


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # DCP in one process
@pytest.mark.parametrize("flatten", [True, False])
def test_both_forms_round_trip_and_are_told_apart(tmp_path, flatten):
    model, opt = _trained()
    saving = OptimizerState(model, opt)
    saving.flatten = flatten
    dcp.save({"optimizer": saving}, checkpoint_id=str(tmp_path))
    keys = read_metadata(tmp_path).state_dict_metadata
    assert optimizer_saved_flattened(keys) == flatten
    assert any(k.startswith("optimizer.param_groups.0.weight.") for k in keys) == flatten

    fresh_model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    fresh = torch.optim.AdamW(
        [
            {"params": [fresh_model[0].weight, fresh_model[1].weight], "weight_decay": 0.5},
            {"params": [fresh_model[0].bias, fresh_model[1].bias], "weight_decay": 0.5},
        ],
        lr=1.0,
    )
    loading = OptimizerState(fresh_model, fresh)
    loading.flatten = optimizer_saved_flattened(keys)
    dcp.load({"optimizer": loading}, checkpoint_id=str(tmp_path))
    for got, want in zip(fresh.param_groups, opt.param_groups):
        assert (got["lr"], got["weight_decay"], got["betas"]) == (
            want["lr"],
            want["weight_decay"],
            want["betas"],
        )
    for p, q in zip(fresh_model.parameters(), model.parameters()):
        torch.testing.assert_close(fresh.state[p]["exp_avg"], opt.state[q]["exp_avg"])


def test_plain_tensors_leaves_no_subclass_and_shares_memory():
    class Marked(torch.Tensor):
        pass

    t = torch.arange(4.0)
    tree = {"a": [t.as_subclass(Marked), "name"], "b": t, "c": 3}
    out = plain_tensors(tree)
    assert type(out["a"][0]) is torch.Tensor and out["a"][0].data_ptr() == t.data_ptr()
    assert out["b"] is t and out["a"][1] == "name" and out["c"] == 3
