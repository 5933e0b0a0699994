"""Document masking (block_causal): the masks, their isolation of documents, FlexAttention and the
per-document varlen kernel against the masked-SDPA path, boundary targets, and the loss as one mean over every counted token however
the global batch is split over ranks and micro-batches."""

import dataclasses
import warnings

import pytest
import torch
import torch.nn.functional as F
from helpers import DOC_BOS, DOC_EOS, document_model, document_model_args

import models.attention as attention
from models.attention import (
    Documents,
    block_causal_block_mask,
    block_causal_mask,
    document_ids,
    documents,
)
from titanlite.components.loss import (
    IGNORE_INDEX,
    cross_entropy_loss,
    cross_entropy_sum,
    ignore_boundary_targets,
)

BOS, EOS = DOC_BOS, DOC_EOS
ARGS = document_model_args()


def _stream(lengths: list[int], seed: int = 0) -> torch.Tensor:
    """Documents of the given body lengths framed BOS ... EOS, back to back (as both readers
    frame them)."""
    g = torch.Generator().manual_seed(seed)
    parts = [
        torch.cat(
            [torch.tensor([BOS]), torch.randint(3, 40, (n,), generator=g), torch.tensor([EOS])]
        )
        for n in lengths
    ]
    return torch.cat(parts)


_model = document_model


def test_document_ids_start_at_each_bos_and_a_cut_document_is_its_own():
    tokens = torch.tensor([[7, 8, EOS, BOS, 5, EOS, BOS, 6], [BOS, 5, 6, 7, 8, 9, 10, 11]])
    assert document_ids(tokens, BOS).tolist() == [[0, 0, 0, 1, 1, 1, 2, 2], [1] * 8]
    mask = block_causal_mask(tokens, BOS)
    assert mask.shape == (2, 1, 8, 8) and mask.dtype == torch.bool
    # The window-start fragment (positions 0-2) is one document; the second row is plain causal.
    assert mask[0, 0, 2, :3].all() and not mask[0, 0, 3, :3].any() and mask[0, 0, 3, 3]
    assert torch.equal(mask[1, 0], torch.ones(8, 8, dtype=torch.bool).tril())


def test_a_token_never_attends_to_another_document():
    tokens = _stream([5, 9, 3, 10])[None, :32]  # four documents, the last cut by the window
    docs = document_ids(tokens, BOS)[0]
    a = docs == 2
    perturbed = tokens.clone()
    perturbed[0, a] = torch.randint(
        3, 40, (int(a.sum()),), generator=torch.Generator().manual_seed(1)
    )
    perturbed[0, a.nonzero()[0]] = BOS  # the document still starts where it did
    model = _model()
    with torch.no_grad():
        out, out_perturbed = model(tokens), model(perturbed)
    assert not torch.equal(out[0, a], out_perturbed[0, a])  # the perturbation did something
    assert torch.equal(out[0, ~a], out_perturbed[0, ~a])  # bit for bit elsewhere
    # With the causal mask the documents after it would change: the test can tell the masks apart.
    causal = _model(attn_mask_type="causal")
    with torch.no_grad():
        after = docs > 2
        assert not torch.equal(causal(tokens)[0, after], causal(perturbed)[0, after])


def test_one_document_per_window_is_plain_causal_attention():
    tokens = torch.cat([torch.tensor([BOS]), torch.randint(3, 40, (31,))])[None]
    with torch.no_grad():
        masked, causal = _model()(tokens), _model(attn_mask_type="causal")(tokens)
    torch.testing.assert_close(masked, causal, rtol=0, atol=1e-5)


def test_flex_forward_matches_the_masked_sdpa_path(monkeypatch):
    # Eager FlexAttention applies the same BlockMask as the compiled kernel; compiling it costs
    # close to a minute on 2 CPU cores, which the GPU check pays instead.
    monkeypatch.setattr(attention, "_compiled_flex", attention.flex_attention)
    tokens = torch.stack([_stream([4, 12, 2, 20])[:32], _stream([30, 5], seed=1)[:32]])
    sdpa, flex = _model(), _model(attn_type="flex")
    assert isinstance(flex.attention_mask(tokens), attention.BlockMask)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager FlexAttention warns that it is for debugging
        torch.testing.assert_close(flex(tokens), sdpa(tokens), rtol=0, atol=1e-5)
        causal_flex, causal_sdpa = (
            _model(attn_type=t, attn_mask_type="causal") for t in ("flex", "sdpa")
        )
        torch.testing.assert_close(causal_flex(tokens), causal_sdpa(tokens), rtol=0, atol=1e-5)
    # The plain causal BlockMask is built once per shape.
    assert causal_flex.attention_mask(tokens) is causal_flex.attention_mask(tokens)


def test_documents_start_at_every_bos_and_every_sequence_start():
    tokens = torch.tensor([[5, 5, BOS, 5, BOS, BOS], [BOS, 5, 5, 5, 5, 5], [5] * 6])
    docs = documents(tokens, BOS)
    assert docs.cu_seqlens_q.tolist() == [0, 2, 4, 5, 6, 12, 18]
    assert docs.cu_seqlens_k is docs.cu_seqlens_q and docs.key_index is None
    assert docs.cu_seqlens_q.dtype == torch.int32 and docs.max_q == docs.max_k == 6


def _varlen_tokens() -> torch.Tensor:
    # Cut documents, one-token documents, a window that is one document, and one made of BOS.
    return torch.stack(
        [
            _stream([3, 0, 10, 40])[5:37],
            _stream([40])[:32],
            _stream([0] * 20)[:32],
            torch.cat([_stream([12]), _stream([2, 1]), _stream([30])])[:32],
        ]
    )


@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_varlen_matches_masked_sdpa_in_the_forward_and_every_gradient(n_kv_heads):
    tokens = _varlen_tokens()
    outs, grads = {}, {}
    for kind in ("sdpa", "varlen", "auto"):
        model = _model(attn_type=kind, n_kv_heads=n_kv_heads)
        logits = model(tokens)
        (logits.pow(2).mean() + logits[:, -1].sum()).backward()
        outs[kind], grads[kind] = logits, {n: p.grad for n, p in model.named_parameters()}
    assert isinstance(_model(attn_type="auto").attention_mask(tokens), Documents)
    for kind in ("varlen", "auto"):
        torch.testing.assert_close(outs[kind], outs["sdpa"], rtol=0, atol=1e-5)
        for name, grad in grads["sdpa"].items():
            torch.testing.assert_close(grads[kind][name], grad, rtol=0, atol=1e-5, msg=name)


def test_compiled_varlen_blocks_compile_once_for_every_document_count():
    import torch._dynamo.utils as dynamo_utils

    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    eager, compiled = _model(attn_type="varlen"), _model(attn_type="varlen")
    for block in compiled.layers.values():
        block.compile(fullgraph=True)
    tokens = _varlen_tokens()
    try:
        for rows in (tokens[:2], tokens[2:], tokens[1:3]):  # 9, 33 and 22 documents
            torch.testing.assert_close(compiled(rows), eager(rows), rtol=0, atol=1e-5)
        assert dynamo_utils.counters["stats"]["unique_graphs"] == 1
    finally:
        torch._dynamo.reset()


def test_block_mask_marks_the_same_pairs_as_the_boolean_mask():
    tokens = torch.stack([_stream([40, 60, 30])[:128], _stream([3] * 30)[:128]])
    dense = block_causal_mask(tokens, BOS)[:, 0]
    block = block_causal_block_mask(tokens, BOS)
    q, kv = torch.arange(128)[:, None], torch.arange(128)[None, :]
    for b in range(2):
        assert torch.equal(block.mask_mod(b, 0, q, kv), dense[b])


def test_block_causal_without_bos_id_is_refused():
    with pytest.raises(ValueError, match="bos_id"):
        _model(bos_id=-1)(torch.zeros(1, 4, dtype=torch.long))


def test_boundary_targets_get_no_loss():
    window = _stream([3, 4])  # BOS a b c EOS BOS d e f g EOS
    labels = ignore_boundary_targets(window[1:], BOS)
    inputs = window[:-1]
    ignored = labels == IGNORE_INDEX
    # Exactly the targets after an EOS: the next document's BOS, predicted across the boundary.
    assert ignored.tolist() == (inputs == EOS).tolist() and int(ignored.sum()) == 1
    logits = torch.randn(1, len(inputs), 40, requires_grad=True)
    cross_entropy_sum(logits, labels[None]).backward()
    assert logits.grad is not None and not logits.grad[0, ignored].any()
    assert logits.grad[0, ~ignored].abs().sum(-1).gt(0).all()


def test_loss_is_the_token_mean_however_the_batch_is_split():
    """The trainer's arithmetic (titanlite.trainer.trainer.Trainer.train_step), replayed in one process:
    each rank's micro-batch losses are summed, scaled by dp_size / (targets counted over every
    rank and micro-batch); the logged loss is the mean of the ranks' shares, and the gradient the
    mean of the ranks' gradients (as FSDP and DDP average). Documents of very different lengths
    make the counted targets differ between micro-batches and ranks."""
    torch.manual_seed(0)
    lengths = [1, 2, 150, 3, 40, 1, 1, 7, 90, 2, 5, 300, 1, 12, 4, 60, 2]
    stream = _stream(lengths)
    seq, windows = 16, 16
    batch = stream[: windows * (seq + 1)].view(windows, seq + 1)
    inputs, labels = batch[:, :-1], ignore_boundary_targets(batch[:, 1:], BOS)
    weight = torch.randn(40, 40, requires_grad=True)

    def logits(x: torch.Tensor) -> torch.Tensor:
        return F.embedding(x, weight)

    reference = cross_entropy_loss(logits(inputs), labels)
    (ref_grad,) = torch.autograd.grad(reference, weight)

    for dp, accum in [(1, 1), (2, 2), (4, 2), (2, 4), (8, 1)]:
        # Rank r's micro-batch i holds windows [r*per_rank + i*local, ...) of the global batch.
        per_rank = windows // dp
        local = per_rank // accum
        ranks = [
            [slice(r * per_rank + i * local, r * per_rank + (i + 1) * local) for i in range(accum)]
            for r in range(dp)
        ]
        counted = sum(int((labels[s] != IGNORE_INDEX).sum()) for rank in ranks for s in rank)
        scale = dp / counted
        shares, grads = [], []
        for rank in ranks:
            share = sum(cross_entropy_sum(logits(inputs[s]), labels[s]) * scale for s in rank)
            shares.append(share)
            grads.append(torch.autograd.grad(share, weight)[0])
        per_rank_counts = {int((labels[s] != IGNORE_INDEX).sum()) for rank in ranks for s in rank}
        assert len(per_rank_counts) > 1 or dp * accum == 1  # the split is uneven
        logged = torch.stack(shares).mean()
        assert abs(logged.item() - reference.item()) <= 1e-6, (dp, accum)
        torch.testing.assert_close(torch.stack(grads).mean(0), ref_grad, rtol=1e-5, atol=1e-7)


def test_activation_estimate_counts_the_sdpa_mask():
    from titanlite.planning.activation_memory import estimate_activations

    b, s, e, layers = 2, 512, 4, ARGS.n_layers
    kw = dict(
        local_batch_size=b, seq_len=s, tp=1, loss_parallel=False, ac_mode="none", ac_option="2"
    )
    causal = estimate_activations(
        dataclasses.replace(ARGS, attn_mask_type="causal"), compute_bytes=e, **kw
    )
    masked = estimate_activations(ARGS, compute_bytes=e, **kw)
    flex = estimate_activations(dataclasses.replace(ARGS, attn_type="flex"), compute_bytes=e, **kw)
    # The boolean mask once, and SDPA's float32 copy of it saved by each block.
    assert masked.total - causal.total == b * s * s + layers * e * b * s * s
    assert flex.total == causal.total


def test_sdpa_saves_one_additive_mask_per_block():
    """What the estimate above rests on: torch's SDPA turns the boolean mask into an additive
    mask in the compute dtype and saves it for backward, in every block."""
    model = _model()
    tokens = torch.cat([_stream([10, 20])[:32], _stream([30])[:32]]).view(2, 32)
    masks = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.shape == (2, 1, 32, 32):
            masks.append((t.dtype, t.untyped_storage().data_ptr()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(tokens)
    assert len({ptr for _, ptr in masks}) == ARGS.n_layers
    assert {dtype for dtype, _ in masks} == {torch.float32}


def test_flex_training_on_cpu_is_a_preflight_error():
    from helpers import DEBUG_CONFIG

    from titanlite.config.loader import ConfigError
    from titanlite.preflight import checks as preflight

    with pytest.raises(ConfigError, match="attn_type = 'flex' cannot train on CPU"):
        preflight.run(["--config", str(DEBUG_CONFIG), "--model.attn_type", "flex"], 1)


def test_varlen_on_cuda_in_float32_is_a_preflight_error():
    # Flash takes 16-bit inputs only; planned for CUDA (as a dry run does) on this machine.
    from helpers import DEBUG_CONFIG

    from parallelisms import ParallelDims
    from titanlite.config.loader import ConfigError, load
    from titanlite.preflight import checks as preflight

    argv = ["--config", str(DEBUG_CONFIG), "--model.attn_type", "varlen"]
    dims = ParallelDims(1, 1, 1, 1)
    fp32 = load([*argv, "--training.mixed_precision_param", "float32"])
    with pytest.raises(ConfigError, match="attn_type = 'varlen' runs flash attention on CUDA"):
        preflight.check_devices(fp32, dims, "cuda", planning=True)
    bf16 = load([*argv, "--training.mixed_precision_param", "bfloat16"])
    preflight.check_devices(bf16, dims, "cuda", planning=True)
