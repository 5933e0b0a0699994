"""acc and acc_norm of a multiple-choice task and their standard errors, as lm-eval-harness 0.4
computes them (api/task.py `process_results`, api/metrics.py `mean_stderr`): the choice of
highest log-likelihood, and of highest log-likelihood per character of the choice's text (lm-eval
divides by `len(choice)`, the characters of the choice without the delimiter; for ASCII text its
bytes); the first such choice on a tie (numpy's argmax); the standard error of the mean over
examples with the sample standard deviation."""

from __future__ import annotations

import math

from titanlite.evals.tasks import Task


def score(task: Task, loglikelihoods: list[float]) -> dict[str, float]:
    """`loglikelihoods`: one per request of build_requests(task), in its order."""
    acc, acc_norm, at = [], [], 0
    for ex in task.examples:
        lls = [float(x) for x in loglikelihoods[at : at + len(ex.choices)]]
        at += len(ex.choices)
        normed = [ll / float(len(c)) for ll, c in zip(lls, ex.choices)]
        acc.append(float(_argmax(lls) == ex.gold))
        acc_norm.append(float(_argmax(normed) == ex.gold))
    assert at == len(loglikelihoods), (at, len(loglikelihoods))
    return {
        "acc": _mean(acc),
        "acc_stderr": _stderr(acc),
        "acc_norm": _mean(acc_norm),
        "acc_norm_stderr": _stderr(acc_norm),
    }


def _argmax(values: list[float]) -> int:
    """numpy's argmax: the first of the largest."""
    return max(range(len(values)), key=lambda i: (values[i], -i))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _stderr(values: list[float]) -> float:
    if len(values) < 2:
        return math.nan
    mu = _mean(values)
    return math.sqrt(sum((x - mu) ** 2 for x in values) / (len(values) - 1)) / math.sqrt(
        len(values)
    )
