from collections import OrderedDict

import torch

from titanlite.components.checkpoint.manager import _flatten, _unflatten


def test_flatten_round_trip_keeps_structure_and_passes_plain_data_through():
    buffer = list(range(1000))
    sd = {
        "model": OrderedDict(a=torch.ones(2), b=torch.zeros(3)),
        "loader": {"buffer": buffer, "n": 3},
        "opt": {
            "param_groups": [{"lr": 0.1, "betas": (0.9, 0.95), "params": ["a"]}],
            "state": {"a": {"step": torch.tensor(1.0)}},
        },
        "empty": {},
        "mixed": [torch.ones(1), {"e": 1}],
    }
    flat = _flatten(sd)
    assert flat[((dict, "loader"), (dict, "buffer"))] is buffer  # a leaf, not walked
    back = _unflatten(flat)
    assert back["loader"]["buffer"] is buffer and back["empty"] == {}
    assert back["opt"]["param_groups"][0]["betas"] == (0.9, 0.95)
    assert torch.equal(back["model"]["b"], sd["model"]["b"]) and back["mixed"][1] == {"e": 1}
