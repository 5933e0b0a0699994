"""The [eval] tasks, read and tokenized before any process group or model exists: a broken task
file is one line (exit 2) at launch, not an exception after the first interval of training."""

from __future__ import annotations

from dataclasses import dataclass

from titanlite.config.schema import JobConfig
from titanlite.data import Tokenizer
from titanlite.evals import Request, Task, TaskError, build_requests, load_task


@dataclass(frozen=True)
class EvalTask:
    task: Task
    requests: tuple[Request, ...]


def check_eval_tasks(job: JobConfig, tokenizer: Tokenizer) -> dict[str, EvalTask]:
    """{task name: the task and its requests}; {} when [eval] is off."""
    if not job.eval.enabled:
        return {}
    if not job.eval.tasks:
        raise TaskError("eval.tasks is empty; name a task (titanlite_mc) or set eval.enabled false")
    tasks: dict[str, EvalTask] = {}
    for spec in job.eval.tasks:
        task = load_task(spec, job.eval.limit)
        if task.name in tasks:
            raise TaskError(
                f"eval.tasks: two tasks are named {task.name!r}; their metrics would mix"
            )
        requests = build_requests(task, tokenizer.encode, job.training.seq_len, tokenizer.bos_id)
        tasks[task.name] = EvalTask(task, tuple(requests))
    return tasks
