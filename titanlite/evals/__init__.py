"""Downstream evaluation: multiple-choice tasks scored by log-likelihood, as lm-eval-harness
scores them (tasks.py reads them, requests.py tokenizes them, metrics.py scores them)."""

from titanlite.evals.metrics import score
from titanlite.evals.requests import Request, build_requests
from titanlite.evals.tasks import BUILTIN_TASKS, Example, Task, TaskError, load_task

__all__ = [
    "BUILTIN_TASKS",
    "Example",
    "Request",
    "Task",
    "TaskError",
    "build_requests",
    "load_task",
    "score",
]
