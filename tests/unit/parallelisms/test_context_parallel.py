"""Context parallel's cut and masks, in one process: each simulated cp rank's queries against the
gathered keys give exactly the rows of one-process attention, with documents that straddle the
chunk borders (the distributed runs are in tests/distributed: gradient and layout parity)."""

import pytest
import torch
import torch.nn.functional as F

from models.attention import block_causal_mask
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


def _model(mask_type: str, rope: str) -> Transformer:
    args = FLAVORS["debugmodel"].with_overrides(
        vocab_size=64, max_seq_len=32, attn_mask_type=mask_type, rope_positions=rope, bos_id=1
    )
    model = Transformer(args)
    model.init_weights(0)
    return model


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("balancer", ["headtail", "none"])
@pytest.mark.parametrize(
    "mask_type, rope",
    [("causal", "window"), ("block_causal", "window"), ("block_causal", "document")],
)
def test_each_rank_attends_as_one_process(cp, balancer, mask_type, rope):
    model = _model(mask_type, rope)
    seq = 32
    tokens = torch.randint(2, 64, (2, seq), generator=torch.Generator().manual_seed(0))
    # Documents starting mid-chunk, so that several cross the chunk (and rank) borders.
    tokens[0, [0, 5, 13, 27]] = 1
    tokens[1, [3, 20]] = 1
    full_mask = model.attention_mask(tokens)
    if full_mask is None:
        full_mask = torch.ones(seq, seq, dtype=torch.bool).tril()[None, None]
    q, k, v = (
        torch.randn(2, 4, seq, 16, generator=torch.Generator().manual_seed(i)) for i in (1, 2, 3)
    )
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=full_mask)
    freqs = model.rope_freqs(tokens)
    keys = torch.cat([rank_positions(seq, cp, r, balancer) for r in range(cp)])
    for r in range(cp):
        mine = rank_positions(seq, cp, r, balancer)
        mask = model.attention_mask(tokens, (mine, keys))
        assert mask.dtype == torch.float32  # additive: SDPA saves it as it is, for all blocks
        got = F.scaled_dot_product_attention(
            q[:, :, mine], k[:, :, keys], v[:, :, keys], attn_mask=mask
        )
        torch.testing.assert_close(got, expected[:, :, mine], rtol=1e-6, atol=1e-6)
        # RoPE rows at the rank's positions equal the one-process rotations of those tokens.
        x = torch.randn(2, seq, 4, 16)
        want, _ = apply_rope(x, x, freqs)
        got_rope, _ = apply_rope(x[:, mine], x[:, mine], model.rope_freqs(tokens, mine))
        torch.testing.assert_close(got_rope, want[:, mine])
    if mask_type == "block_causal":  # the case is not trivially causal
        assert not torch.equal(
            block_causal_mask(tokens, 1)[0, 0], torch.ones(seq, seq).tril().bool()
        )


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
