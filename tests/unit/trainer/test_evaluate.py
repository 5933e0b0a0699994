"""The evaluator's loop in this process, on a real two-block debug model: a request's
log-likelihood is the model's own (the continuation's next-token log-probabilities summed,
computed here from the logits), whatever rows share its batch, and a long evaluation says how
far it has got."""

import contextlib
import dataclasses
import logging

import pytest
import torch

from models.llama import FLAVORS, Transformer
from titanlite.components.loss import cross_entropy_rows
from titanlite.config import loader
from titanlite.data import Tokenizer, resolve_tokenizer_path
from titanlite.preflight.evals import check_eval_tasks
from titanlite.trainer import evaluate

LIMIT = 6  # examples: 24 requests


def _evaluator(model, tasks, tokenizer, batch: int) -> evaluate.Evaluator:
    job = loader.load(["--eval.enabled", "--eval.limit", str(LIMIT)])
    return evaluate.Evaluator(
        job.eval,
        tasks,
        lambda inputs, labels, tokens: cross_entropy_rows(model(inputs), labels),
        [model],
        torch.device("cpu"),
        batch,
        job.training.seq_len,
        tokenizer.eos_id,
        dp_rank=0,
        dp_size=1,
        global_sum=lambda t: t,
        loss_parallel=False,
        amp=contextlib.nullcontext(),
        fixed_shape=False,
    )


@pytest.fixture(scope="module")
def setup():
    tokenizer = Tokenizer(resolve_tokenizer_path(""))
    job = loader.load(["--eval.enabled", "--eval.limit", str(LIMIT)])
    tasks = check_eval_tasks(job, tokenizer)
    args = dataclasses.replace(FLAVORS["debugmodel"], n_layers=2, vocab_size=tokenizer.vocab_size)
    torch.manual_seed(0)
    model = Transformer(args)
    model.init_weights(seed=0)
    return model, tasks, tokenizer


def _by_hand(model, request) -> float:
    tokens = torch.tensor(request.tokens)
    with torch.no_grad():
        logp = model(tokens[None, :-1]).float().log_softmax(-1)[0]
    n = request.continuation
    targets = tokens[-n:]
    return logp[len(tokens) - 1 - n :].gather(1, targets[:, None]).sum().item()


def test_each_request_scores_its_own_continuation_in_any_batch(setup):
    model, tasks, tokenizer = setup
    requests = [r for t in tasks.values() for r in t.requests]
    assert len(requests) == 4 * LIMIT
    want = [_by_hand(model, r) for r in requests]
    for batch in (1, 5, 8):  # 5: the last batch padded with rows that count nothing
        got = _evaluator(model, tasks, tokenizer, batch).loglikelihoods()
        assert got == pytest.approx(want, rel=1e-5, abs=1e-5), batch
    assert model.training  # put back in training mode


def test_a_long_evaluation_says_how_far_it_has_got(setup, monkeypatch, caplog):
    model, tasks, tokenizer = setup
    monkeypatch.setattr(evaluate, "PROGRESS_EVERY_S", 0.0)
    with caplog.at_level(logging.INFO, logger="titanlite"):
        _evaluator(model, tasks, tokenizer, 8).loglikelihoods()
    lines = [r.getMessage() for r in caplog.records if "forwards per rank done" in r.getMessage()]
    # 24 requests in 3 forwards: a line after each but the last (the results line follows it).
    assert [line.split(" (")[0] for line in lines] == [
        "eval: 1 of 3 forwards per rank done",
        "eval: 2 of 3 forwards per rank done",
    ]
