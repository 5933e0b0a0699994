"""Qwen3 hyper-parameters and the published flavors: dense (Qwen/Qwen3-0.6B ... Qwen3-32B on the
Hugging Face hub; the same names as TorchTitan's qwen3 flavors) and Mixture-of-Experts
(Qwen3-30B-A3B, Qwen3-235B-A22B: every block's feed-forward an MoE, models/moe.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from models.decoder import check_attention_args
from models.moe import MoEArgs
from models.spec import ArgsRecord

# The published embeddings' rows: Qwen3's tokenizer has 151,669 tokens, padded to 151,936 rows (the
# rows past the tokenizer are never an input; their logits learn to stay low).
QWEN3_VOCAB = 151_936


@dataclass(frozen=True)
class Qwen3Args(ArgsRecord):
    dim: int = 4096
    n_layers: int = 36
    n_heads: int = 32
    n_kv_heads: int | None = 8  # None = n_heads (no grouped-query attention)
    # Decoupled from dim: Qwen3's q projection is dim -> n_heads x head_dim (0.6B: 1024 -> 2048).
    head_dim: int = 128
    ffn_hidden_dim: int = 12288  # SwiGLU hidden size (HF intermediate_size), given outright
    # Mixture of Experts: with moe_experts > 0 every block's feed-forward is an MoE (the
    # published MoE members: decoder_sparse_step 1, no mlp_only_layers) and ffn_hidden_dim is
    # unused. The fields are models.moe.MoEArgs' (HF num_experts, num_experts_per_tok,
    # moe_intermediate_size, norm_topk_prob, router_aux_loss_coef).
    moe_experts: int = 0
    moe_top_k: int = 8
    moe_hidden_dim: int = 768
    moe_norm_topk_prob: bool = True
    moe_score_func: str = "softmax"
    moe_shared_hidden_dim: int = 0
    moe_load_balance: str = "aux_loss"
    moe_aux_loss_coef: float = 1e-3
    moe_bias_update_rate: float = 1e-3
    # -1: the tokenizer's vocabulary; the published flavors fix theirs (QWEN3_VOCAB), which the
    # tokenizer must fit in.
    vocab_size: int = -1
    norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_seq_len: int = 40960  # the published max_position_embeddings
    # The output head is the embedding (one parameter), as the small published flavors.
    tie_word_embeddings: bool = False
    # Scale the init of output projections by depth (GPT-2 / TorchTitan's depth_init).
    depth_init: bool = True
    # Attention kernel, mask and RoPE positions: as LlamaArgs (models/decoder.py).
    attn_type: str = "sdpa"
    attn_mask_type: str = "causal"
    rope_positions: str = "window"
    bos_id: int = -1

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def moe(self) -> MoEArgs | None:
        """The blocks' MoE, None for a dense model."""
        if not self.moe_experts:
            return None
        return MoEArgs(
            num_experts=self.moe_experts,
            top_k=self.moe_top_k,
            hidden_dim=self.moe_hidden_dim,
            shared_hidden_dim=self.moe_shared_hidden_dim,
            score_func=self.moe_score_func,
            norm_topk_prob=self.moe_norm_topk_prob,
            load_balance=self.moe_load_balance,
            aux_loss_coef=self.moe_aux_loss_coef,
            bias_update_rate=self.moe_bias_update_rate,
        )

    def check(self) -> None:
        """Shape constraints that the model itself needs; ValueError names the broken one."""
        if self.vocab_size < 1:
            raise ValueError(f"vocab_size = {self.vocab_size}: must be set (from the tokenizer)")
        if self.n_heads % self.kv_heads:
            raise ValueError(
                f"n_heads = {self.n_heads} is not divisible by n_kv_heads = {self.kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim = {self.head_dim} must be even for RoPE")
        self.moe  # noqa: B018  (MoEArgs checks its own fields)
        check_attention_args(self)


def _flavor(dim: int, n_layers: int, n_heads: int, ffn: int, tied: bool) -> Qwen3Args:
    return Qwen3Args(
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=8,
        ffn_hidden_dim=ffn,
        tie_word_embeddings=tied,
        vocab_size=QWEN3_VOCAB,
    )


# Tiny, for CPU runs and tests: 8 heads of 64 = 512 wider than dim 256, as in Qwen3's own shapes,
# and grouped-query attention, so both decouplings are exercised.
_DEBUG = Qwen3Args(dim=256, n_layers=4, n_heads=8, n_kv_heads=4, head_dim=64, ffn_hidden_dim=768)


def _moe_flavor(dim: int, n_layers: int, n_heads: int, ffn: int, moe_hidden: int) -> Qwen3Args:
    return replace(
        _flavor(dim, n_layers, n_heads, ffn, tied=False),
        n_kv_heads=4,
        moe_experts=128,
        moe_top_k=8,
        moe_hidden_dim=moe_hidden,
    )


# Tiny MoE for CPU runs and tests: 8 experts of width 128, 2 chosen per token.
_DEBUG_MOE = replace(_DEBUG, moe_experts=8, moe_top_k=2, moe_hidden_dim=128)

FLAVORS: dict[str, Qwen3Args] = {
    "debugmodel": _DEBUG,
    "debugmodel_tied": replace(_DEBUG, tie_word_embeddings=True),  # as the small flavors
    "0.6B": _flavor(1024, 28, 16, 3072, tied=True),
    "1.7B": _flavor(2048, 28, 16, 6144, tied=True),
    "4B": _flavor(2560, 36, 32, 9728, tied=True),
    "8B": _flavor(4096, 36, 32, 12288, tied=False),
    "14B": _flavor(5120, 40, 40, 17408, tied=False),
    "32B": _flavor(5120, 64, 64, 25600, tied=False),
    "debugmodel_moe": _DEBUG_MOE,
    "30B-A3B": _moe_flavor(2048, 48, 32, 6144, 768),
    "235B-A22B": _moe_flavor(4096, 94, 64, 12288, 1536),
}


def num_params(args: Qwen3Args, include_embedding: bool = True, active_only: bool = False) -> int:
    """Exact parameter count (a tied head counted once), without building the model;
    `active_only`: an MoE's parameters that one token runs through (router, its top k experts,
    the shared experts), on which its FLOPs and MFU are counted."""
    d, hd = args.dim, args.head_dim
    attention = d * args.n_heads * hd * 2 + d * args.kv_heads * hd * 2 + 2 * hd  # + q/k norms
    per_block = attention + _feed_forward_params(args, active_only) + 2 * d
    head = 0 if args.tie_word_embeddings else args.vocab_size * d
    total = args.n_layers * per_block + d + head
    return total + (args.vocab_size * d if include_embedding else 0)


def _feed_forward_params(args: Qwen3Args, active_only: bool) -> int:
    d, moe = args.dim, args.moe
    if moe is None:
        return 3 * d * args.ffn_hidden_dim
    experts = moe.top_k if active_only else moe.num_experts
    return d * moe.num_experts + experts * 3 * d * moe.hidden_dim + 3 * d * moe.shared_hidden_dim


def training_flops_per_token(args: Qwen3Args, seq_len: int) -> int:
    """Forward + backward FLOPs per token: 6 x the parameters that multiply activations (every
    block's, an MoE's active ones only, and the output head's even when it is the embedding)
    plus the attention scores and values (12 x layers x heads x head_dim x seq_len, TorchTitan's
    and PaLM's count)."""
    matmuls = num_params(args, include_embedding=False, active_only=True)
    if args.tie_word_embeddings:
        matmuls += args.vocab_size * args.dim
    attention = 12 * args.n_layers * args.n_heads * args.head_dim * seq_len
    return 6 * matmuls + attention
