"""DeepSeek-V3, as Hugging Face's `DeepseekV3ForCausalLM` (plus the MTP modules it keeps apart):
pre-norm blocks of multi-head latent attention (models/deepseek_v3/attention.py) and a SwiGLU
feed-forward, dense in the first `first_k_dense_replace` blocks and DeepSeekMoE after (the
shared MoE layer of models/moe.py: sigmoid scores, the expert bias, group-limited routing, a
shared expert, the routed scaling factor); an untied output head.

Multi-token prediction (models/deepseek_v3/mtp.py): `mtp` holds mtp_depth modules, run only when
the forward is given their targets (`mtp_targets`): training. Their cross-entropy sums, one per
depth, are left in `mtp_loss_sums` (with their autograd graph) for the trainer, which weighs
them into the step's objective; each depth's logits are freed as soon as its loss is computed.
Validation, generation and export see the main model only.

Masks, RoPE positions and the forward up to the head are `models.decoder.Decoder`'s.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models.decoder import Decoder, DecoderBlock, Positions, depth_out_std
from models.deepseek_v3.args import DeepSeekV3Args
from models.deepseek_v3.attention import MultiHeadLatentAttention, rope_table
from models.deepseek_v3.mtp import IGNORE_INDEX, MTPModule, mtp_targets, shift_left
from models.layers import FeedForward
from models.moe import MoE


def block(layer_id: int, args: DeepSeekV3Args) -> DecoderBlock:
    """Block `layer_id`; an MTP module's block is numbered on from n_layers."""
    moe = args.moe
    feed_forward = (
        MoE(args.dim, moe)
        if moe is not None and args.is_moe_block(layer_id)
        else FeedForward(args.dim, args.ffn_hidden_dim)
    )
    depth = min(layer_id, args.n_layers - 1)  # an MTP block is initialized as the last one
    return DecoderBlock(
        MultiHeadLatentAttention(args),
        feed_forward,
        args.dim,
        args.norm_eps,
        depth_out_std(depth, args.n_layers, args.depth_init),
    )


class DeepSeekV3(Decoder):
    def __init__(self, args: DeepSeekV3Args):
        super().__init__(args, lambda i: block(i, args))
        # Keyed by the number its block would have after the main ones (n_layers + k), which
        # is also where Hugging Face's files keep it.
        self.mtp = nn.ModuleDict(
            {
                str(i): MTPModule(args.dim, args.norm_eps, block(i, args))
                for i in range(args.n_layers, args.n_layers + args.mtp_depth)
            }
        )
        self.mtp_loss_sums: list[torch.Tensor] = []

    def rope_table(self, device: torch.device | None) -> torch.Tensor:
        return rope_table(self.args, device)

    def mtp_targets(self, labels: torch.Tensor) -> list[torch.Tensor]:
        """Each MTP depth's targets for the main model's labels (none without MTP)."""
        return mtp_targets(labels, len(self.mtp))

    def forward(
        self,
        x: torch.Tensor,
        tokens: torch.Tensor | None = None,
        positions: Positions | None = None,
        mtp_targets: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """As `Decoder.forward`; with `mtp_targets` (training), the MTP modules run too and
        leave their loss sums in `mtp_loss_sums`."""
        h, (freqs, mask) = self.hidden_states(x, tokens, positions)
        if self.output is None:
            return h
        if mtp_targets:
            ids = x if tokens is None else tokens
            query_positions = None if positions is None else positions[0]
            self.mtp_loss_sums = self._mtp_losses(ids, query_positions, h, freqs, mask, mtp_targets)
        return self.output(h)

    def _mtp_losses(
        self,
        ids: torch.Tensor,
        query_positions: torch.Tensor | None,
        h: torch.Tensor,
        freqs: torch.Tensor,
        mask,
        targets: list[torch.Tensor],
    ) -> list[torch.Tensor]:
        """`ids`: the whole window's; under context parallel `h` and `targets` hold this rank's
        `query_positions` of it, and the token k ahead of each is picked from the whole window
        (it may be another rank's)."""
        # Pipeline parallel is refused with MTP before a model is built: the embedding is
        # needed beside the head.
        if self.tok_embeddings is None or self.output is None:
            raise ValueError("multi-token prediction needs the embedding and the output head")
        sums = []
        for k, (module, target) in enumerate(zip(self.mtp.values(), targets), start=1):
            ahead = shift_left(ids, k, 0)
            if query_positions is not None:
                ahead = ahead.index_select(1, query_positions)
            embedded = self.tok_embeddings(ahead)
            h = module(h, embedded, freqs, mask)
            logits = self.output(h)
            sums.append(
                F.cross_entropy(
                    logits.flatten(0, 1).float(),
                    target.flatten(),
                    ignore_index=IGNORE_INDEX,
                    reduction="sum",
                )
            )
        return sums

    @torch.no_grad()
    def init_weights(self, seed: int, buffer_device: torch.device | None = None) -> None:
        super().init_weights(seed, buffer_device)
        for k, module in self.mtp.items():
            module.init_weights(f"mtp.{k}", seed)  # type: ignore[operator]
