"""DeepSeek-V3 hyper-parameters and the published flavors: multi-head latent attention (MLA),
DeepSeekMoE (sigmoid routing with the auxiliary-loss-free expert bias, group-limited routing,
shared experts, dense blocks first) and multi-token prediction (MTP). The field names follow
titanlite's other families where the concept is the same (dim, n_layers, moe_*) and Hugging
Face's `DeepseekV3Config` otherwise (q_lora_rank, kv_lora_rank, qk_nope_head_dim, ...).

Flavors: "16B" is DeepSeek-V2-Lite's published shapes (15.7B parameters, 2.4B active: softmax
routing, no query compression, no group routing, no MTP), "671B" DeepSeek-V3's (and R1's, and
Kimi K2's architecture at other sizes), both with the YaRN RoPE scaling their config.json has."""

from __future__ import annotations

import math
from dataclasses import dataclass

from models.decoder import check_attention_args
from models.moe import MoEArgs
from models.spec import ArgsRecord

DEEPSEEK_V3_VOCAB = 129_280  # DeepSeek-V3's tokenizer (128K tokens, padded)
DEEPSEEK_V2_VOCAB = 102_400


@dataclass(frozen=True)
class DeepSeekV3Args(ArgsRecord):
    dim: int = 7168
    n_layers: int = 61
    n_heads: int = 128
    # Multi-head latent attention. Queries: dim -> q_lora_rank (normalized) -> heads x (nope +
    # rope), or directly dim -> heads x (nope + rope) with q_lora_rank 0. Keys and values: dim ->
    # kv_lora_rank (normalized) -> heads x (nope + v), plus one rope key of qk_rope_head_dim
    # shared by every head, computed from dim directly (the "decoupled" RoPE key).
    q_lora_rank: int = 1536
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    ffn_hidden_dim: int = 18432  # the dense blocks' SwiGLU width (HF intermediate_size)
    first_k_dense_replace: int = 3  # blocks 0 .. k-1 are dense, the rest MoE
    moe_experts: int = 256  # routed experts (HF n_routed_experts); 0 = every block dense
    moe_top_k: int = 8
    moe_hidden_dim: int = 2048  # each routed expert's width (HF moe_intermediate_size)
    moe_shared_experts: int = 1  # HF n_shared_experts: one SwiGLU this many experts wide
    moe_score_func: str = "sigmoid"
    moe_norm_topk_prob: bool = True
    moe_routed_scaling_factor: float = 2.5
    moe_n_group: int = 8
    moe_topk_group: int = 4
    moe_load_balance: str = "expert_bias"
    moe_aux_loss_coef: float = 1e-3  # with moe_load_balance "aux_loss" (the Switch loss)
    moe_bias_update_rate: float = 1e-3
    # DeepSeek-V3's complementary sequence-wise balance loss (its alpha: 1e-4); 0 = off.
    moe_seq_aux_loss_coef: float = 1e-4
    # Multi-token prediction: mtp_depth modules, module k predicting the token k + 1 after the
    # next, sharing the embedding and the output head; their mean loss weighs mtp_loss_weight
    # (DeepSeek-V3: 0.3 for its first 10T tokens, then 0.1).
    mtp_depth: int = 1
    mtp_loss_weight: float = 0.3
    vocab_size: int = -1  # -1: the tokenizer's; the published flavors fix theirs
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # YaRN (as config.json's rope_scaling names them); rope_factor 1 = plain RoPE.
    rope_factor: float = 40.0
    rope_original_max_seq_len: int = 4096
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    rope_mscale: float = 1.0
    rope_mscale_all_dim: float = 1.0
    max_seq_len: int = 4096
    depth_init: bool = True
    # Attention kernel, mask and RoPE positions: as LlamaArgs (models/decoder.py).
    attn_type: str = "sdpa"
    attn_mask_type: str = "causal"
    rope_positions: str = "window"
    bos_id: int = -1

    @property
    def kv_heads(self) -> int:
        return self.n_heads  # MLA expands every head's key and value from the latent

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def head_dim(self) -> int:
        """The rotated width of a head: what the RoPE table covers."""
        return self.qk_rope_head_dim

    @property
    def n_dense_layers(self) -> int:
        return (
            self.n_layers
            if not self.moe_experts
            else min(self.first_k_dense_replace, self.n_layers)
        )

    @property
    def softmax_scale(self) -> float:
        """1/sqrt(qk_head_dim), times YaRN's mscale(factor, mscale_all_dim) squared (the
        published models' scale: DeepSeek's reference code and Hugging Face's
        `yarn_apply_mscale`)."""
        scale = self.qk_head_dim**-0.5
        if self.rope_factor > 1 and self.rope_mscale_all_dim:
            scale *= yarn_mscale(self.rope_factor, self.rope_mscale_all_dim) ** 2
        return scale

    @property
    def moe(self) -> MoEArgs | None:
        """The MoE blocks' MoE, None for a dense model."""
        if not self.moe_experts:
            return None
        return MoEArgs(
            num_experts=self.moe_experts,
            top_k=self.moe_top_k,
            hidden_dim=self.moe_hidden_dim,
            shared_hidden_dim=self.moe_shared_experts * self.moe_hidden_dim,
            score_func=self.moe_score_func,
            norm_topk_prob=self.moe_norm_topk_prob,
            load_balance=self.moe_load_balance,
            aux_loss_coef=self.moe_aux_loss_coef,
            bias_update_rate=self.moe_bias_update_rate,
            routed_scaling_factor=self.moe_routed_scaling_factor,
            n_group=self.moe_n_group,
            topk_group=self.moe_topk_group,
            sequence_aux_coef=self.moe_seq_aux_loss_coef,
        )

    def is_moe_block(self, layer_id: int) -> bool:
        """Block `layer_id` (an MTP module's block counts on from n_layers) is an MoE."""
        return bool(self.moe_experts) and layer_id >= self.first_k_dense_replace

    def check(self) -> None:
        """Shape constraints that the model itself needs; ValueError names the broken one."""
        if self.vocab_size < 1:
            raise ValueError(f"vocab_size = {self.vocab_size}: must be set (from the tokenizer)")
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} = {getattr(self, name)}: must be at least 1")
        if self.q_lora_rank < 0:
            raise ValueError(f"q_lora_rank = {self.q_lora_rank}: 0 (no query compression) or more")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim = {self.qk_rope_head_dim} must be even for RoPE")
        if self.rope_factor < 1:
            raise ValueError(f"rope_factor = {self.rope_factor}: 1 (no YaRN) or more")
        if self.mtp_depth < 0:
            raise ValueError(f"mtp_depth = {self.mtp_depth}: 0 (off) or more")
        self.moe  # noqa: B018  (MoEArgs checks its own fields)
        check_attention_args(self)

    def check_parallelism(self, *, pp: int, cp: int) -> None:
        """What the model cannot run on: MTP needs the embedding beside the head (one
        pipeline stage)."""
        if self.mtp_depth and pp > 1:
            raise ValueError(
                f"model.mtp_depth = {self.mtp_depth} (multi-token prediction) is not built for "
                f"pipeline parallel (parallelism.pipeline_parallel_degree = {pp}); set "
                "--model.mtp_depth 0 or pipeline_parallel_degree = 1"
            )


def yarn_mscale(factor: float, mscale: float) -> float:
    """YaRN's attention scale (its eq. 21): 0.1 x mscale x ln(factor) + 1, 1 without scaling."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


# Tiny, for CPU runs and tests: one dense block then MoE blocks of 8 experts in 4 groups (a
# token's 2 experts from its 2 best groups), a shared expert, query compression, values
# narrower than queries and keys, one MTP module. Plain RoPE: YaRN only matters past the
# original context (tests set rope_factor to check it against Hugging Face).
_DEBUG = DeepSeekV3Args(
    dim=256,
    n_layers=4,
    n_heads=8,
    q_lora_rank=96,
    kv_lora_rank=64,
    qk_nope_head_dim=32,
    qk_rope_head_dim=16,
    v_head_dim=24,
    ffn_hidden_dim=768,
    first_k_dense_replace=1,
    moe_experts=8,
    moe_top_k=2,
    moe_hidden_dim=128,
    moe_shared_experts=1,
    moe_n_group=4,
    moe_topk_group=2,
    mtp_depth=1,
    rope_factor=1.0,
)

# DeepSeek-V2-Lite (config.json of deepseek-ai/DeepSeek-V2-Lite).
_16B = DeepSeekV3Args(
    dim=2048,
    n_layers=27,
    n_heads=16,
    q_lora_rank=0,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    ffn_hidden_dim=10944,
    first_k_dense_replace=1,
    moe_experts=64,
    moe_top_k=6,
    moe_hidden_dim=1408,
    moe_shared_experts=2,
    moe_score_func="softmax",
    moe_norm_topk_prob=False,
    moe_routed_scaling_factor=1.0,
    moe_n_group=1,
    moe_topk_group=1,
    moe_load_balance="aux_loss",
    moe_aux_loss_coef=1e-3,
    moe_seq_aux_loss_coef=0.0,
    mtp_depth=0,
    vocab_size=DEEPSEEK_V2_VOCAB,
    rope_mscale=0.707,
    rope_mscale_all_dim=0.707,
)

# DeepSeek-V3 (config.json of deepseek-ai/DeepSeek-V3): the dataclass defaults.
_671B = DeepSeekV3Args(vocab_size=DEEPSEEK_V3_VOCAB)

FLAVORS: dict[str, DeepSeekV3Args] = {
    "debugmodel": _DEBUG,
    "16B": _16B,
    "671B": _671B,
}


def attention_params(args: DeepSeekV3Args) -> int:
    d, n = args.dim, args.n_heads
    if args.q_lora_rank:
        q = d * args.q_lora_rank + args.q_lora_rank + args.q_lora_rank * n * args.qk_head_dim
    else:
        q = d * n * args.qk_head_dim
    kv = d * (args.kv_lora_rank + args.qk_rope_head_dim) + args.kv_lora_rank
    kv += args.kv_lora_rank * n * (args.qk_nope_head_dim + args.v_head_dim)
    return q + kv + n * args.v_head_dim * d


def feed_forward_params(args: DeepSeekV3Args, moe_block: bool, active_only: bool) -> int:
    d, moe = args.dim, args.moe
    if not moe_block or moe is None:
        return 3 * d * args.ffn_hidden_dim
    experts = moe.top_k if active_only else moe.num_experts
    return d * moe.num_experts + experts * 3 * d * moe.hidden_dim + 3 * d * moe.shared_hidden_dim


def block_params(args: DeepSeekV3Args, layer_id: int, active_only: bool = False) -> int:
    ffn = feed_forward_params(args, args.is_moe_block(layer_id), active_only)
    return attention_params(args) + ffn + 2 * args.dim


def mtp_params(args: DeepSeekV3Args, active_only: bool = False) -> int:
    """The MTP modules' own parameters (the embedding and head are the model's)."""
    d = args.dim
    per_module = 2 * d + 2 * d * d + d  # enorm, hnorm, eh_proj, their final norm
    return sum(
        per_module + block_params(args, args.n_layers + k, active_only)
        for k in range(args.mtp_depth)
    )


def num_params(
    args: DeepSeekV3Args, include_embedding: bool = True, active_only: bool = False
) -> int:
    """Exact parameter count without building the model, MTP modules included; `active_only`:
    the parameters one token runs through (its top k experts of each MoE)."""
    blocks = sum(block_params(args, i, active_only) for i in range(args.n_layers))
    total = blocks + mtp_params(args, active_only) + args.dim + args.vocab_size * args.dim
    return total + (args.vocab_size * args.dim if include_embedding else 0)


def training_flops_per_token(args: DeepSeekV3Args, seq_len: int) -> int:
    """Forward + backward FLOPs per token: 6 x the active parameters that multiply activations
    (every MTP module's head pass included) plus attention's scores and values (6 x layers x
    heads x (qk_head_dim + v_head_dim) x seq_len: the PaLM count with MLA's two head widths)."""
    matmuls = num_params(args, include_embedding=False, active_only=True)
    matmuls += args.mtp_depth * args.vocab_size * args.dim  # each MTP module's head
    layers = args.n_layers + args.mtp_depth
    attention = 6 * layers * args.n_heads * (args.qk_head_dim + args.v_head_dim) * seq_len
    return 6 * matmuls + attention
