"""Initialization and gradient clipping on sharded parameters, on real gloo process groups."""

import torch
from helpers import spawn

from models.llama import FLAVORS, Transformer
from parallelisms import ParallelDims, ParallelizeOptions
from parallelisms.llama import parallelize_llama
from titanlite.components.optim import clip_grad_norm_

ARGS = FLAVORS["debugmodel"].with_overrides(vocab_size=512, n_layers=2, max_seq_len=32)


def _full_weights(model) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    return {
        n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for n, p in model.named_parameters()
    }


def _sharded_model(world: int, tp: int):
    dims = ParallelDims.resolve(1, -1, tp, world)
    with torch.device("meta"):
        model = Transformer(ARGS)
    parallelize_llama(model, dims, dims.build_meshes("cpu"), ParallelizeOptions())
    model.to_empty(device="cpu")
    model.init_weights(seed=3)
    return model


def _check_init(rank, world, tp, out):
    weights = _full_weights(_sharded_model(world, tp))
    if rank == 0:
        torch.save(weights, out)


def test_init_is_the_same_on_every_layout(tmp_path):
    reference = Transformer(ARGS)
    reference.init_weights(seed=3)
    ref = dict(reference.named_parameters())
    for name, tp in (("fsdp2", 1), ("tp2", 2)):
        out = tmp_path / f"{name}.pt"
        spawn(_check_init, 2, tp, str(out))
        got = torch.load(out)
        assert set(got) == set(ref)
        for key, value in got.items():
            assert torch.equal(value, ref[key].detach()), f"{name}: {key} differs"


def _check_clip(rank, world, out):
    torch.manual_seed(0)
    model = _sharded_model(world, 2)
    tokens = torch.randint(0, 512, (2, 16))
    from torch.distributed.tensor.parallel import loss_parallel

    with loss_parallel():
        logits = model(tokens)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
        loss.backward()
    params = list(model.parameters())
    norm = clip_grad_norm_(params, max_norm=0.5)
    grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
    if rank == 0:
        torch.save({"norm": norm, "grads": grads}, out)


def test_clip_grad_norm_on_sharded_gradients_matches_dense(tmp_path):
    out = tmp_path / "clip.pt"
    spawn(_check_clip, 2, str(out))
    got = torch.load(out)
    model = Transformer(ARGS)
    model.init_weights(seed=3)
    torch.manual_seed(0)
    tokens = torch.randint(0, 512, (2, 16))
    torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten()).backward()
    dense_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
    torch.testing.assert_close(got["norm"], dense_norm, rtol=1e-5, atol=1e-6)
    for n, p in model.named_parameters():
        torch.testing.assert_close(got["grads"][n], p.grad, rtol=1e-4, atol=1e-6)
