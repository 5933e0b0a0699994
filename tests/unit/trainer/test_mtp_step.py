"""The trainer's step with DeepSeek-V3's multi-token prediction, against the objective computed
independently here: the main loss is the mean cross-entropy over the step's counted targets,
`loss_mtp` the mean cross-entropy of the labels shifted once more over their own counted
targets (the last position of each window has none), and every gradient is that of main +
mtp_loss_weight x loss_mtp; over two accumulation micro-batches that count different numbers
of targets."""

import copy
import dataclasses

import torch
import torch.nn.functional as F
from helpers import one_process_train_step

from models.deepseek_v3 import FLAVORS, DeepSeekV3
from titanlite.components.loss import IGNORE_INDEX

VOCAB, SEQ, WEIGHT = 256, 16, 0.3
ARGS = dataclasses.replace(
    FLAVORS["debugmodel"], n_layers=2, vocab_size=VOCAB, max_seq_len=SEQ, mtp_loss_weight=WEIGHT
)


def _microbatches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for ignored in (3, 7):
        tokens = torch.randint(0, VOCAB, (2, SEQ + 1), generator=g)
        labels = tokens[:, 1:].clone()
        labels[0, :ignored] = IGNORE_INDEX  # different counts in each micro-batch
        out.append((tokens[:, :-1], labels))
    return out


def _independent(model: DeepSeekV3, microbatches) -> tuple[torch.Tensor, torch.Tensor]:
    """(main mean, MTP mean) over the step, from the model's pieces, not the trainer's code."""
    main_sum = mtp_sum = torch.zeros(())
    main_count = mtp_count = 0
    [module] = model.mtp.values()
    for x, labels in microbatches:
        h, (freqs, mask) = model.hidden_states(x, None, None)
        main_sum = main_sum + F.cross_entropy(
            model.output(h).flatten(0, 1),
            labels.flatten(),
            ignore_index=IGNORE_INDEX,
            reduction="sum",
        )
        main_count += int((labels != IGNORE_INDEX).sum())
        ahead = torch.cat([x[:, 1:], torch.zeros_like(x[:, :1])], dim=1)
        logits = model.output(module(h, model.tok_embeddings(ahead), freqs, mask))
        target = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], IGNORE_INDEX)], dim=1)
        mtp_sum = mtp_sum + F.cross_entropy(
            logits.flatten(0, 1), target.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
        )
        mtp_count += int((target != IGNORE_INDEX).sum())
    return main_sum / main_count, mtp_sum / mtp_count


def test_the_step_weighs_each_depth_over_its_own_targets():
    torch.manual_seed(0)
    model = DeepSeekV3(ARGS)
    model.init_weights(seed=0)
    reference = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    step = one_process_train_step(model, optimizer, scheduler, max_norm=0.0)
    microbatches = _microbatches()
    out = step(microbatches)
    main, mtp = _independent(reference, microbatches)
    print(
        f"main {out.loss.item():.6f} vs {main.item():.6f}, mtp {out.mtp_loss.item():.6f} vs {mtp.item():.6f}"
    )
    assert torch.allclose(out.loss, main, rtol=1e-6) and torch.allclose(
        out.mtp_loss, mtp, rtol=1e-6
    )
    (main + WEIGHT * mtp).backward()
    want = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        assert p.grad is not None and want[name].grad is not None, name
        torch.testing.assert_close(p.grad, want[name].grad, rtol=1e-5, atol=1e-7, msg=name)
