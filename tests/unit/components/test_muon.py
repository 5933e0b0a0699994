"""Muon on one process, through the trainer's own step, against torch's own optimizers: every
hidden matrix (each expert's gate, up and down matrices as matrices of their own) stepped by
torch.optim.Muon, everything else by torch.optim.AdamW, each under the same LR schedule. Five
steps of the Llama, Qwen3 MoE and DeepSeek-V3 debug models (MLA's projections, shared and
routed experts, MTP), weights compared after every step."""

import copy
import dataclasses

import pytest
import torch
from helpers import one_process_train_step
from torch.optim._muon import _zeropower_via_newtonschulz

from models.deepseek_v3 import FLAVORS as DEEPSEEK_FLAVORS
from models.deepseek_v3 import DeepSeekV3
from models.llama import FLAVORS as LLAMA_FLAVORS
from models.llama import Transformer
from models.qwen3 import FLAVORS as QWEN3_FLAVORS
from models.qwen3 import Qwen3
from titanlite.components.muon import NS_COEFFICIENTS, newton_schulz
from titanlite.components.optim import build_lr_scheduler, build_optimizer
from titanlite.config.schema import LRScheduler, Optimizer

VOCAB, SEQ, STEPS = 256, 16, 5
CFG = Optimizer(name="Muon", lr=3e-3, weight_decay=0.1, adamw_lr=1e-3, adamw_weight_decay=0.01)
SCHEDULE = LRScheduler(warmup_steps=2)


def _model(family: str) -> torch.nn.Module:
    cls, flavors, flavor = {
        "llama": (Transformer, LLAMA_FLAVORS, "debugmodel"),
        "qwen3_moe": (Qwen3, QWEN3_FLAVORS, "debugmodel_moe"),
        "deepseek_v3": (DeepSeekV3, DEEPSEEK_FLAVORS, "debugmodel"),
    }[family]
    args = dataclasses.replace(flavors[flavor], n_layers=2, vocab_size=VOCAB, max_seq_len=SEQ)
    model = cls(args)
    model.init_weights(seed=0)
    return model


class TorchMuonAndAdamW:
    """The reference: torch's Muon on leaves that are the hidden matrices (an expert weight's
    matrices copied out and back around each step) and torch's AdamW on the rest, by a rule
    written here: the embedding, the head, routers and vectors are AdamW's."""

    def __init__(self, model: torch.nn.Module, cfg: Optimizer):
        self.copies: list[tuple[torch.Tensor, tuple, torch.Tensor]] = []
        muon, decay, no_decay = [], [], []
        for name, p in model.named_parameters():
            if p.dim() < 2:
                no_decay.append(p)
            elif name in ("tok_embeddings.weight", "output.weight") or ".router." in name:
                decay.append(p)
            elif p.dim() == 2:
                muon.append(p)
            else:
                blocks = 2 if name.endswith("experts.w13") else 1
                rows = p.shape[1] // blocks
                for e in range(p.shape[0]):
                    for b in range(blocks):
                        index = (e, slice(b * rows, (b + 1) * rows))
                        leaf = p.detach()[index].clone().requires_grad_()
                        self.copies.append((p, index, leaf))
                        muon.append(leaf)
        self.muon = torch.optim.Muon(
            muon,
            lr=cfg.lr,
            weight_decay=cfg.weight_decay,
            momentum=cfg.momentum,
            nesterov=cfg.nesterov,
            adjust_lr_fn=cfg.adjust_lr_fn,
        )
        self.adamw = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.adamw_weight_decay}, {"params": no_decay}],
            lr=cfg.adamw_lr,
            betas=(cfg.beta1, cfg.beta2),
            eps=cfg.eps,
            weight_decay=0.0,
            fused=True,
        )
        self.schedules = [build_lr_scheduler(o, SCHEDULE, STEPS) for o in (self.muon, self.adamw)]

    def step(self) -> None:
        for p, index, leaf in self.copies:
            leaf.grad = p.grad[index].clone()
        self.muon.step()
        self.adamw.step()
        for s in self.schedules:
            s.step()
        with torch.no_grad():
            for p, index, leaf in self.copies:
                p[index] = leaf


def _train_step(model, optimizer, scheduler):
    return one_process_train_step(model, optimizer, scheduler, max_norm=1.0)


@pytest.mark.parametrize("family", ["llama", "qwen3_moe", "deepseek_v3"])
def test_muon_equals_torch_muon_and_adamw_step_for_step(family):
    torch.manual_seed(0)
    model = _model(family)
    reference = copy.deepcopy(model)
    optimizer = build_optimizer(model, CFG)
    mine = _train_step(model, optimizer, build_lr_scheduler(optimizer, SCHEDULE, STEPS))
    # The reference's gradients come from the same step (clipping included); its SGD at lr 0
    # changes nothing, torch's optimizers then step.
    sgd = torch.optim.SGD(reference.parameters(), lr=0.0)
    theirs = _train_step(reference, sgd, torch.optim.lr_scheduler.LambdaLR(sgd, lambda _: 1.0))
    torch_optimizers = TorchMuonAndAdamW(reference, CFG)
    g = torch.Generator().manual_seed(1)
    losses = []
    for step in range(1, STEPS + 1):
        tokens = torch.randint(0, VOCAB, (2, SEQ + 1), generator=g)
        batch = [(tokens[:, :-1], tokens[:, 1:])]
        losses.append(mine(batch).loss.item())
        theirs(batch)
        torch_optimizers.step()
        want = dict(reference.named_parameters())
        worst = max(((p - want[n]).abs().max().item(), n) for n, p in model.named_parameters())
        assert worst[0] <= 1e-6, f"step {step}: {worst[1]} off by {worst[0]:.2e}"
    print(f"\n{family}: losses {losses}, worst weight difference after step {STEPS}: {worst}")
    assert losses[-1] < losses[0]
    moved = [
        n for n, p in model.named_parameters() if not torch.equal(p, _model(family).state_dict()[n])
    ]
    assert len(moved) == len(list(model.parameters()))  # every parameter trained


def test_the_split_leaves_embeddings_head_routers_and_vectors_to_adamw():
    model = _model("deepseek_v3")
    optimizer = build_optimizer(model, dataclasses.replace(CFG, muon_exclude=["mtp.*.eh_proj.*"]))
    names = {id(p): n for n, p in model.named_parameters()}
    by_group = {}
    for group in optimizer.param_groups:
        key = (group["algorithm"], group.get("row_blocks", 1), group["weight_decay"])
        by_group[key] = sorted(names[id(p)] for p in group["params"])
    muon = by_group[("muon", 1, 0.1)] + by_group[("muon", 2, 0.1)]
    adamw = by_group[("adamw", 1, 0.01)] + by_group[("adamw", 1, 0.0)]
    assert sorted(muon + adamw) == sorted(names.values())
    assert by_group[("muon", 2, 0.1)] == [
        "layers.1.feed_forward.experts.w13",
        "mtp.2.block.feed_forward.experts.w13",
    ]
    for name in (
        "tok_embeddings.weight",
        "output.weight",
        "layers.1.feed_forward.router.gate.weight",
        "mtp.2.eh_proj.weight",
    ):
        assert name in by_group[("adamw", 1, 0.01)], name
    assert all(dict(model.named_parameters())[n].dim() == 1 for n in by_group[("adamw", 1, 0.0)])
    for name in (
        "layers.0.attention.wq_a.weight",
        "layers.0.attention.wkv_b.weight",
        "layers.1.feed_forward.experts.w2",
        "layers.1.feed_forward.shared_experts.w1.weight",
    ):
        assert name in muon, name
    assert {g["lr"] for g in optimizer.param_groups if g["algorithm"] == "adamw"} == {1e-3}


@pytest.mark.parametrize("shape", [(96, 256), (256, 96), (3, 2, 64, 48)])
def test_batched_newton_schulz_is_torch_s_for_each_matrix(shape):
    g = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    got = newton_schulz(g, NS_COEFFICIENTS, 5, 1e-7)
    matrices = g.reshape(-1, *shape[-2:])
    want = torch.stack([_zeropower_via_newtonschulz(m, NS_COEFFICIENTS, 5, 1e-7) for m in matrices])
    assert torch.equal(got.reshape(want.shape), want)
