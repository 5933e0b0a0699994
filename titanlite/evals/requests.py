"""The log-likelihood requests of a task, tokenized by lm-eval-harness's rules (0.4,
api/model.py `_encode_pair` and models/huggingface.py): a context's trailing spaces move to
the start of the continuation; the continuation's tokens are those of context + continuation
past the context's own tokens (so a merge across the boundary counts for the continuation); no
BOS (HFLM's default for causal models) except as the whole context of an empty one; a request
longer than the model's window keeps its last seq_len + 1 tokens."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from titanlite.evals.tasks import Task, TaskError


@dataclass(frozen=True)
class Request:
    example: int
    choice: int
    tokens: tuple[int, ...]  # context + continuation, at most seq_len + 1 of them
    continuation: int  # how many of the last tokens are the continuation's


def encode_pair(
    encode: Callable[[str], list[int]], context: str, continuation: str
) -> tuple[list[int], list[int]]:
    spaces = len(context) - len(context.rstrip())
    if spaces:
        continuation = context[-spaces:] + continuation
        context = context[:-spaces]
    whole, head = encode(context + continuation), encode(context)
    return head, whole[len(head) :]


def build_requests(
    task: Task, encode: Callable[[str], list[int]], seq_len: int, prefix_id: int
) -> list[Request]:
    """One request per choice of every example, in order (example-major)."""
    requests = []
    for i, ex in enumerate(task.examples):
        for j, choice in enumerate(ex.choices):
            continuation = task.target_delimiter + choice
            if ex.context == "":
                head, tail = [prefix_id], encode(continuation)
            else:
                head, tail = encode_pair(encode, ex.context, continuation)
            if not tail or len(tail) > seq_len:
                raise TaskError(
                    f"eval.tasks: {task.name} example {i} choice {j} is {len(tail)} tokens; "
                    f"a continuation must be 1 to training.seq_len = {seq_len} tokens"
                )
            tokens = (head + tail)[-(seq_len + 1) :]
            requests.append(Request(i, j, tuple(tokens), len(tail)))
    return requests
