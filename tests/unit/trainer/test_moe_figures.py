"""The MoE figures the metrics log: each layer's max/mean load of the last step under its name
(wrappers' parts removed), the largest, and the aux loss's mean over layers and ranks."""

import torch
from torch import nn

from models.moe import MoE, MoEArgs, finish_step
from titanlite.trainer.callbacks.metrics import moe_figures


class Wrapped(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self._checkpoint_wrapped_module = inner

    def forward(self, x):
        return self._checkpoint_wrapped_module(x)


def test_figures_name_each_layer_and_average_the_aux_loss():
    args = MoEArgs(num_experts=4, top_k=1, hidden_dim=8, load_balance="aux_loss")
    model = nn.Sequential(Wrapped(MoE(16, args)), MoE(16, args))
    for i, layer in enumerate(m for m in model.modules() if isinstance(m, MoE)):
        layer.init_weights(f"l{i}", 0, 0.02)
    model(torch.randn(2, 6, 16)).sum().backward()
    finish_step(model, lambda t: t)
    seen = []
    record = moe_figures(model, lambda t: seen.append(t) or float(t) * 2)  # "another rank"
    assert set(record["moe_imbalance"]) == {"0", "1"}
    layers = [m for m in model.modules() if isinstance(m, MoE)]
    for name, layer in zip(("0", "1"), layers):
        load = layer.step_load.float()
        assert record["moe_imbalance"][name] == (load.max() / load.mean()).item()
        assert load.sum() == 12
    assert record["moe_imbalance_max"] == max(record["moe_imbalance"].values())
    mean_aux = (layers[0].last_aux_loss + layers[1].last_aux_loss) / 2
    assert abs(record["moe_aux_loss"] - 2 * mean_aux.item()) < 1e-6 and len(seen) == 1
