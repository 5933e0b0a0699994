"""Context parallel's cut and masks, in one process: each simulated cp rank's queries against the
gathered keys give exactly the rows of one-process attention, with documents that straddle the
chunk borders (the distributed runs are in tests/distributed: gradient and layout parity)."""

import pytest
import torch
import torch.nn.functional as F

from models.attention import Documents, attend, block_causal_mask, document_pieces
from models.llama import FLAVORS, Transformer
from models.llama.model import apply_rope
from parallelisms.context_parallel import check_context_parallel, rank_positions
from parallelisms.parallel_dims import LayoutError


def test_head_tail_pairs_an_early_chunk_with_a_late_one():
    assert [rank_positions(8, 2, r, "headtail").tolist() for r in range(2)] == [
        [0, 1, 6, 7],
        [2, 3, 4, 5],
    ]
    assert [rank_positions(8, 2, r, "none").tolist() for r in range(2)] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
    ]
    # Every position is held exactly once, and causal work (keys visible per query) is even.
    for cp in (2, 4):
        parts = [rank_positions(64, cp, r, "headtail") for r in range(cp)]
        assert sorted(torch.cat(parts).tolist()) == list(range(64))
        work = {int((p + 1).sum()) for p in parts}
        assert len(work) == 1, work


def _model(mask_type: str, rope: str, attn_type: str = "sdpa") -> Transformer:
    args = FLAVORS["debugmodel"].with_overrides(
        vocab_size=64,
        max_seq_len=32,
        attn_mask_type=mask_type,
        rope_positions=rope,
        bos_id=1,
        attn_type=attn_type,
    )
    model = Transformer(args)
    model.init_weights(0)
    return model


def _qkv(seq: int) -> list[torch.Tensor]:
    # Grouped-query heads (4 queries, 2 keys/values), as the kernels must take them.
    shapes = [(2, 4, seq, 16), (2, 2, seq, 16), (2, 2, seq, 16)]
    return [
        torch.randn(s, generator=torch.Generator().manual_seed(i)).requires_grad_()
        for i, s in enumerate(shapes)
    ]


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("balancer", ["headtail", "none"])
@pytest.mark.parametrize(
    "mask_type, rope",
    [("causal", "window"), ("block_causal", "window"), ("block_causal", "document")],
)
@pytest.mark.parametrize("attn_type", ["auto", "sdpa"])
def test_each_rank_attends_as_one_process(cp, balancer, mask_type, rope, attn_type):
    """Every rank's output rows, and the sum over ranks of the gradients of q, k and v, equal
    one process's attention; "auto" runs the per-piece kernel (no mask), "sdpa" the mask."""
    model = _model(mask_type, rope, attn_type)
    seq = 32
    tokens = torch.randint(2, 64, (2, seq), generator=torch.Generator().manual_seed(0))
    # Documents starting mid-chunk, so that several cross the chunk (and rank) borders.
    tokens[0, [0, 5, 13, 27]] = 1
    tokens[1, [3, 20]] = 1
    full_mask = block_causal_mask(tokens, 1)
    if mask_type == "causal":
        full_mask = torch.ones(seq, seq, dtype=torch.bool).tril()[None, None]
    q, k, v = _qkv(seq)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=full_mask, enable_gqa=True)
    grad_out = torch.randn(expected.shape, generator=torch.Generator().manual_seed(9))
    want_grads = torch.autograd.grad(expected, (q, k, v), grad_out)
    got_grads = [torch.zeros_like(t) for t in (q, k, v)]
    freqs = model.rope_freqs(tokens)
    keys = torch.cat([rank_positions(seq, cp, r, balancer) for r in range(cp)])
    for r in range(cp):
        mine = rank_positions(seq, cp, r, balancer)
        mask = model.attention_mask(tokens, (mine, keys))
        if attn_type == "sdpa":
            assert mask.dtype == torch.float32  # additive: SDPA saves it as it is, for all blocks
        else:
            assert isinstance(mask, Documents) and mask.key_index is not None
        got = attend(q[:, :, mine], k[:, :, keys], v[:, :, keys], mask)
        torch.testing.assert_close(got, expected[:, :, mine], rtol=1e-5, atol=1e-5)
        for total, g in zip(got_grads, torch.autograd.grad(got, (q, k, v), grad_out[:, :, mine])):
            total += g
        # RoPE rows at the rank's positions equal the one-process rotations of those tokens.
        x = torch.randn(2, seq, 4, 16)
        want, _ = apply_rope(x, x, freqs)
        got_rope, _ = apply_rope(x[:, mine], x[:, mine], model.rope_freqs(tokens, mine))
        torch.testing.assert_close(got_rope, want[:, mine])
    for got_g, want_g in zip(got_grads, want_grads):
        torch.testing.assert_close(got_g, want_g, rtol=1e-5, atol=1e-5)
    if mask_type == "block_causal":  # the case is not trivially causal
        assert not torch.equal(
            block_causal_mask(tokens, 1)[0, 0], torch.ones(seq, seq).tril().bool()
        )


def test_pieces_compute_only_the_visible_keys():
    """The per-piece kernel's work under the head-tail cut: each rank computes against exactly
    the keys its queries may see (the causal triangle's share, equal across ranks), not all
    keys; and a document border removes the keys before it."""
    seq, cp = 64, 4
    tokens = torch.randint(2, 64, (1, seq), generator=torch.Generator().manual_seed(0))
    keys = torch.cat([rank_positions(seq, cp, r, "headtail") for r in range(cp)])
    work = []
    for r in range(cp):
        mine = rank_positions(seq, cp, r, "headtail")
        docs = document_pieces(tokens, 1, mine, keys, within_documents=False)
        q_lens = torch.diff(docs.cu_seqlens_q)
        k_lens = torch.diff(docs.cu_seqlens_k)
        # Two chunks, one piece each; the middle rank's two chunks touch and make one piece.
        assert q_lens.tolist() == ([16] if r == cp - 1 else [8, 8])
        # Query i of a piece sees its piece's keys up to itself (bottom-right causal).
        work.append(int((k_lens * q_lens - q_lens * (q_lens - 1) // 2).sum()))
        assert int(k_lens.sum()) <= seq + seq // (2 * cp)  # never more than S + one chunk
    assert len(set(work)) == 1 and sum(work) == seq * (seq + 1) // 2
    tokens[0, 40] = 1  # rank 0's tail chunk (56..63) starts its keys at the document's start
    docs = document_pieces(tokens, 1, rank_positions(seq, cp, 0, "headtail"), keys)
    assert torch.diff(docs.cu_seqlens_k).tolist() == [8, 64 - 40]
    rows = docs.key_index[8:]  # the tail piece's keys, in the gathered order: window 40..63
    assert keys[rows].tolist() == list(range(40, 64))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(seq_lens={"training.seq_len": 90}),
            "not divisible by 2 x context_parallel_degree (2)",
        ),
        (
            dict(seq_lens={"training.seq_len": 64, "validation.seq_len": 36}, tp=2),
            "validation.seq_len = 36 is not divisible",
        ),
        (
            dict(load_balancer="none", seq_lens={"training.seq_len": 6}, cp=4),
            "context_parallel_degree (4) x",
        ),
        (dict(rotate_method="alltoall"), "'alltoall' is not built"),
        (dict(attn_type="flex"), "'flex' is not wired"),
        # 'varlen' and 'sdpa' are wired (test_each_rank_attends_as_one_process).
    ],
)
def test_impossible_context_parallel_jobs(kwargs, message):
    args = dict(
        cp=2,
        tp=1,
        seq_lens={"training.seq_len": 64},
        load_balancer="headtail",
        rotate_method="allgather",
        attn_type="sdpa",
    )
    args.update(kwargs)
    with pytest.raises(LayoutError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_context_parallel(**args)
