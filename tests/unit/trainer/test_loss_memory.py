"""The loss region of the trainer's step holds what the dry run plans, per token x vocabulary
entry (scripts/loss_memory.py, here at small vocabularies: the coefficient does not depend on
them): 12 bytes in bf16, the float32 log-softmax and backward's two float32 gradients. Keeping
the bf16 logits alive through backward (14 bytes) or a formula that forgets a gradient fails."""

import sys

import pytest
import torch
from helpers import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
from loss_memory import loss_region  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_the_loss_region_is_what_the_dry_run_plans(dtype):
    measured, planned = loss_region(dtype, vocabs=(4_000, 8_000), tokens=(64, 128))
    assert measured == pytest.approx(12.0, rel=0.02)
    assert planned == pytest.approx(measured, rel=0.02)
