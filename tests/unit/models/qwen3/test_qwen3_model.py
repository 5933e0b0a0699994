"""Qwen3 dense: the published flavors' exact shapes and parameter counts, with transformers'
Qwen3ForCausalLM (built on the meta device from the published config numbers) as the oracle."""

import dataclasses

import pytest
import torch

from models.qwen3 import FLAVORS, Qwen3, num_params, training_flops_per_token
from models.qwen3.args import QWEN3_VOCAB

transformers = pytest.importorskip("transformers")

# config.json of Qwen/Qwen3-<size> on the Hugging Face hub: hidden_size, intermediate_size,
# num_hidden_layers, num_attention_heads, num_key_value_heads, tie_word_embeddings (all: head_dim
# 128, vocab_size 151936, rope_theta 1e6, rms_norm_eps 1e-6, no attention bias).
PUBLISHED = {
    "0.6B": (1024, 3072, 28, 16, 8, True),
    "1.7B": (2048, 6144, 28, 16, 8, True),
    "4B": (2560, 9728, 36, 32, 8, True),
    "8B": (4096, 12288, 36, 32, 8, False),
    "14B": (5120, 17408, 40, 40, 8, False),
    "32B": (5120, 25600, 64, 64, 8, False),
}


def _hf_count(hidden, inter, layers, heads, kv, tied) -> int:
    cfg = transformers.Qwen3Config(
        vocab_size=QWEN3_VOCAB,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=128,
        tie_word_embeddings=tied,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    )
    with torch.device("meta"):
        model = transformers.Qwen3ForCausalLM(cfg)
    return sum(p.numel() for p in model.parameters())  # a tied head counted once


@pytest.mark.parametrize("flavor", list(PUBLISHED))
def test_flavor_is_the_published_config_and_counts_its_parameters(flavor):
    hidden, inter, layers, heads, kv, tied = PUBLISHED[flavor]
    a = FLAVORS[flavor]
    assert (a.dim, a.ffn_hidden_dim, a.n_layers, a.n_heads, a.kv_heads) == (
        hidden,
        inter,
        layers,
        heads,
        kv,
    )
    assert (a.head_dim, a.tie_word_embeddings, a.rope_theta, a.norm_eps) == (128, tied, 1e6, 1e-6)
    args = dataclasses.replace(a, vocab_size=QWEN3_VOCAB, max_seq_len=16)
    with torch.device("meta"):
        model = Qwen3(args)
    counted = sum(p.numel() for p in model.parameters())
    assert counted == num_params(args) == _hf_count(*PUBLISHED[flavor])


def test_debug_flavor_decouples_head_dim_and_is_tiny():
    a = FLAVORS["debugmodel"]
    assert a.n_heads * a.head_dim != a.dim and a.kv_heads < a.n_heads
    assert num_params(dataclasses.replace(a, vocab_size=2048)) < 10_000_000


def test_flops_count_the_tied_head_as_a_matmul():
    tied = dataclasses.replace(FLAVORS["0.6B"], vocab_size=QWEN3_VOCAB)
    untied = dataclasses.replace(tied, tie_word_embeddings=False)
    assert training_flops_per_token(tied, 4096) == training_flops_per_token(untied, 4096)
    assert num_params(untied) - num_params(tied) == QWEN3_VOCAB * 1024


def _tiny(**overrides) -> Qwen3:
    args = dataclasses.replace(FLAVORS["debugmodel"], vocab_size=512, max_seq_len=32, **overrides)
    return Qwen3(args)


def test_tied_head_is_one_parameter_held_once_in_the_state_dict():
    model = _tiny(tie_word_embeddings=True)
    assert model.output.weight is model.tok_embeddings.weight
    sd = model.state_dict()
    assert "output.weight" not in sd and "tok_embeddings.weight" in sd
    fresh = _tiny(tie_word_embeddings=True)
    fresh.load_state_dict(sd)  # strict: the head is not missing
    assert torch.equal(fresh.output.weight, sd["tok_embeddings.weight"])
    assert fresh.output.weight is fresh.tok_embeddings.weight
    assert "output.weight" in _tiny().state_dict()


def test_init_is_a_function_of_the_seed_and_names_only():
    a, b = _tiny(tie_word_embeddings=True), _tiny(tie_word_embeddings=True)
    torch.manual_seed(0)
    a.init_weights(seed=3)
    torch.manual_seed(1)
    b.init_weights(seed=3)
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), name
    layer = a.layers["0"].attention
    assert torch.equal(layer.q_norm.weight, torch.ones(64))
    # The tied table has the head's scale, not the untied embedding's std of 1.
    assert a.tok_embeddings.weight.std().item() < 0.1
    tokens = torch.randint(0, 512, (2, 16))
    assert a(tokens).shape == (2, 16, 512)


def _saved_in_block(model: Qwen3, tokens: torch.Tensor) -> int:
    """Bytes autograd saves inside block 0 (each storage once; parameters and what the model
    builds before the blocks excluded)."""
    skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
    skip.add(model.freqs_cis.untyped_storage().data_ptr())
    saved: dict[int, int] = {}
    inside = [False]
    block = model.layers["0"]
    block.register_forward_pre_hook(lambda *_: inside.__setitem__(0, True))
    block.register_forward_hook(lambda *_: inside.__setitem__(0, False))

    def pack(t: torch.Tensor) -> torch.Tensor:
        if inside[0] and t.untyped_storage().data_ptr() not in skip:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(tokens)
    return sum(saved.values())


def test_the_estimators_qk_norm_term_is_what_torch_saves():
    from models.estimate import block_activations

    model = _tiny()
    model.init_weights(seed=0)
    batch, seq = 2, 32
    tokens = torch.randint(0, 512, (batch, seq), generator=torch.Generator().manual_seed(0))
    with_norms = _saved_in_block(model, tokens)
    attention = model.layers["0"].attention
    attention.q_norm = attention.k_norm = None
    without = _saved_in_block(model, tokens)
    shape = dict(local_batch_size=batch, seq_len=seq, tp=1, cp=1, compute_bytes=4, kernel="sdpa")
    formula = [block_activations(model.args, qk_norm=q, **shape)[0] for q in (True, False)]
    assert with_norms - without == formula[0] - formula[1] > 0


def test_the_tie_survives_the_meta_build_the_trainer_does():
    # meta -> to_empty gives each module its own tensor; init_weights (always next) re-ties.
    args = dataclasses.replace(FLAVORS["debugmodel"], vocab_size=512, tie_word_embeddings=True)
    with torch.device("meta"):
        model = Qwen3(args)
    model.to_empty(device="cpu")
    model.init_weights(seed=0)
    assert model.output.weight is model.tok_embeddings.weight
    assert len(list(model.parameters())) == len(model.state_dict())


def test_published_flavors_keep_their_padded_vocabulary_tiny_ones_take_the_tokenizers():
    """Training Qwen3-8B from scratch with its tokenizer (151,669 tokens) builds the published
    151,936-row embedding, so its checkpoints load into Qwen3ForCausalLM; the debug flavors fit
    the bundled tokenizer."""
    from titanlite.config import loader as config
    from titanlite.families import model_args

    assert model_args(config.load(["--config", "qwen3_8b.toml"]), 151_669).vocab_size == QWEN3_VOCAB
    assert model_args(config.load(["--config", "qwen3_debug.toml"]), 2048).vocab_size == 2048
