"""RoPE positions per document (`rope_positions = "document"`): a document is encoded the same
wherever packing put it in the window; "window" stays what it was (the table's first rows)."""

import dataclasses

import pytest
import torch
from helpers import DOC_BOS, DOC_EOS, document_model

from models.attention import document_positions
from models.llama import Transformer
from models.llama.model import apply_rope

BOS, EOS = DOC_BOS, DOC_EOS
SEQ = 48


def _doc(n: int, seed: int) -> torch.Tensor:
    body = torch.randint(3, 40, (n,), generator=torch.Generator().manual_seed(seed))
    return torch.cat([torch.tensor([BOS]), body, torch.tensor([EOS])])


def _model(**overrides) -> Transformer:
    """The document-masking tests' model, with document positions unless overridden."""
    return document_model(**{"max_seq_len": SEQ, "rope_positions": "document", **overrides})


def test_positions_restart_at_each_bos_and_a_cut_document_counts_from_the_window_start():
    tokens = torch.tensor([[7, 8, EOS, BOS, 5, EOS, BOS, 6], [BOS, 5, 6, 7, 8, 9, 10, 11]])
    assert document_positions(tokens, BOS).tolist() == [
        [0, 1, 2, 0, 1, 2, 0, 1],
        list(range(8)),
    ]


def _outputs_of(doc: torch.Tensor, before: list[torch.Tensor], model: Transformer) -> torch.Tensor:
    """The model's outputs on `doc`'s tokens, packed after the documents `before` and padded
    with a trailing document to the window's length."""
    start = sum(len(d) for d in before)
    filler = _doc(SEQ, seed=99)
    window = torch.cat([*before, doc, filler])[:SEQ]
    with torch.no_grad():
        return model(window[None])[0, start : start + len(doc)]


def test_a_document_is_encoded_the_same_wherever_it_sits():
    doc = _doc(10, seed=1)
    befores = ([_doc(3, seed=2)], [_doc(20, seed=3), _doc(1, seed=4)])
    model = _model()
    first = _outputs_of(doc, [], model)
    for before in befores:
        torch.testing.assert_close(_outputs_of(doc, before, model), first, rtol=0, atol=1e-5)
        # The rotations themselves are the same ones, bit for bit.
        window = torch.cat([*before, doc])[None]
        start = window.shape[1] - len(doc)
        assert torch.equal(model.rope_freqs(window)[0, start:], model.freqs_cis[: len(doc)])
    # Window positions give the same outputs within rounding: under block_causal a document's
    # queries and keys are all shifted by the same offset, and RoPE scores depend only on the
    # difference of two positions. Document positions change the rounding, not the function.
    window_model = _model(rope_positions="window")
    for before in befores:
        shifted = _outputs_of(doc, before, window_model)
        torch.testing.assert_close(shifted, first, rtol=0, atol=1e-5)
    # Across documents (causal) the earlier document does change it: the perturbation is real.
    causal = _model(rope_positions="window", attn_mask_type="causal")
    shifted = _outputs_of(doc, befores[1], causal)
    assert (shifted - _outputs_of(doc, [], causal)).abs().max() > 1e-3


def test_window_positions_are_the_table_unchanged():
    model = _model(rope_positions="window")
    tokens = torch.cat([_doc(5, 1), _doc(30, 2), _doc(20, 3)])[None, :SEQ]
    assert model.rope_freqs(tokens) is model.freqs_cis  # the table itself, no gather
    # Per-token rotations gathered at 0..seq-1 rotate exactly as the table does.
    q, k = torch.randn(2, 1, 16, 4, 16).unbind(0)
    seq = torch.arange(16)[None]
    table, gathered = apply_rope(q, k, model.freqs_cis), apply_rope(q, k, model.freqs_cis[seq])
    assert all(torch.equal(a, b) for a, b in zip(table, gathered))
    # A window that starts with its only document has the same positions either way.
    one_doc = _doc(SEQ, seed=5)[None, :SEQ]
    with torch.no_grad():
        assert torch.equal(_model()(one_doc), model(one_doc))


def test_document_positions_need_block_causal():
    with pytest.raises(ValueError, match="rope_positions = 'document' needs attn_mask_type"):
        _model(attn_mask_type="causal")


def test_document_positions_with_causal_mask_is_a_preflight_error():
    from helpers import DEBUG_CONFIG

    from titanlite.config.loader import ConfigError
    from titanlite.preflight import checks as preflight

    argv = ["--config", str(DEBUG_CONFIG), "--model.attn_mask_type", "causal"]
    with pytest.raises(ConfigError, match="needs attn_mask_type = 'block_causal'"):
        preflight.run([*argv, "--model.rope_positions", "document"], 1)


def test_document_positions_round_less_than_far_window_positions():
    """The one difference document positions make under block_causal: the table's float32
    angles t·θ lose precision as t grows, so a document far into a long window gets slightly
    less exact attention scores than the same document at position 0 (8B's RoPE here)."""
    from models.llama import FLAVORS
    from models.llama.model import rope_frequencies

    args = dataclasses.replace(FLAVORS["8B"], vocab_size=8)
    q, k = torch.randn(2, 1, 64, 1, args.head_dim, generator=torch.Generator().manual_seed(0))
    table = rope_frequencies(args, 32768 + 64)
    # Small angles round little: the reference for the same 64 relative positions.
    exact = rope_frequencies(args, 64).to(torch.complex128)

    def scores(freqs: torch.Tensor, x: torch.Tensor = q, y: torch.Tensor = k) -> torch.Tensor:
        rq, rk = apply_rope(x, y, freqs)
        return torch.einsum("bshd,bthd->st", rq.double(), rk.double())

    reference = scores(exact, q.double(), k.double())
    error = {s: (scores(table[s : s + 64]) - reference).abs().max().item() for s in (0, 32768)}
    assert error[32768] > 100 * error[0], error
