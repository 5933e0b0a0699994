"""Multiple-choice tasks from local files: lm-eval-harness's task YAML (the keys a zero-shot
multiple-choice task over a local JSON/JSONL file uses, read as lm-eval 0.4 reads them), or a
plain JSONL of {"context", "choices", "label"}.

The YAML's `doc_to_text`, `doc_to_choice` and `doc_to_target` follow lm-eval's rules
(api/task.py, ConfigurableTask): a document field's name gives the field; anything else is a
Jinja2 template rendered over the document (lm-eval's environment: strict undefined, trailing
newline kept); a rendered choice list is a Python literal, a rendered target that is all digits
an index, any other target the text of the right choice. A relative `data_files` path is read
from the YAML's folder (lm-eval reads it from the working directory). Keys that would change
what lm-eval scores and that titanlite does not implement (few-shot, `process_docs`, hub
datasets, other metrics) are refused by name: a task is scored as lm-eval scores it or not at
all.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ASSETS = Path(__file__).resolve().parent.parent / "assets" / "evals"
# Tasks that ship with the package, by name: made from the bundled corpus (scripts/make_eval_task.py).
BUILTIN_TASKS = {"titanlite_mc": ASSETS / "titanlite_mc" / "titanlite_mc.yaml"}

METRICS = ("acc", "acc_norm")
# Keys read below, and keys that only describe or tag a task.
_READ = {
    "task",
    "dataset_path",
    "dataset_kwargs",
    "output_type",
    "test_split",
    "validation_split",
    "doc_to_text",
    "doc_to_choice",
    "doc_to_target",
    "target_delimiter",
    "description",
    "metric_list",
    "num_fewshot",
}
_DESCRIPTIVE = {"tag", "group", "metadata", "dataset_name", "training_split", "fewshot_split"}


class TaskError(ValueError):
    """A task file that cannot be scored as lm-eval would; the message names file and fix."""


@dataclass(frozen=True)
class Example:
    context: str
    choices: tuple[str, ...]
    gold: int


@dataclass(frozen=True)
class Task:
    name: str
    examples: tuple[Example, ...]
    target_delimiter: str = " "


def load_task(spec: str, limit: int = -1) -> Task:
    """A task by built-in name or path (.yaml/.yml or .jsonl); its first `limit` examples (-1:
    all, lm-eval's --limit)."""
    path = BUILTIN_TASKS.get(spec) or Path(spec)
    if not path.is_file():
        known = ", ".join(BUILTIN_TASKS)
        raise TaskError(
            f"eval.tasks: {spec!r} is neither a built-in task ({known}) nor a file; give a task "
            "YAML (lm-eval's format) or a JSONL of {context, choices, label}"
        )
    if path.suffix in (".yaml", ".yml"):
        task = _yaml_task(path)
    elif path.suffix == ".jsonl":
        task = Task(path.stem, tuple(_plain_example(d, path, i) for i, d in _read_jsonl(path)))
    else:
        raise TaskError(f"eval.tasks: {path}: expected a .yaml/.yml task or a .jsonl file")
    if not task.examples:
        raise TaskError(f"eval.tasks: {path} holds no examples")
    if limit >= 0:
        task = Task(task.name, task.examples[:limit], task.target_delimiter)
    return task


def _read_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    docs = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise TaskError(f"eval.tasks: cannot read {path}: {e}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except ValueError as e:
            raise TaskError(f"eval.tasks: {path} line {number}: not JSON ({e})") from None
        if not isinstance(doc, dict):
            raise TaskError(f"eval.tasks: {path} line {number}: expected a JSON object")
        docs.append((number, doc))
    return docs


def _plain_example(doc: dict[str, Any], path: Path, line: int) -> Example:
    where = f"eval.tasks: {path} line {line}"
    missing = [k for k in ("context", "choices", "label") if k not in doc]
    if missing:
        raise TaskError(
            f"{where}: missing {', '.join(missing)} (a plain task's lines hold "
            "context, choices and label)"
        )
    return _example(doc["context"], doc["choices"], doc["label"], where)


def _example(context: Any, choices: Any, gold: Any, where: str) -> Example:
    if not isinstance(context, str):
        raise TaskError(f"{where}: the context is {type(context).__name__}, not text")
    if not (isinstance(choices, list | tuple) and len(choices) >= 2):
        raise TaskError(f"{where}: choices must be a list of at least 2 strings, not {choices!r}")
    if not all(isinstance(c, str) and c for c in choices):
        raise TaskError(f"{where}: every choice must be non-empty text: {choices!r}")
    if isinstance(gold, str):
        if gold not in choices:
            raise TaskError(f"{where}: the target {gold!r} is not one of the choices {choices!r}")
        gold = list(choices).index(gold)
    if not (isinstance(gold, int) and not isinstance(gold, bool) and 0 <= gold < len(choices)):
        raise TaskError(
            f"{where}: the label {gold!r} is not an index of the {len(choices)} choices"
        )
    return Example(context, tuple(choices), gold)


def _yaml_task(path: Path) -> Task:
    import yaml

    try:
        cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise TaskError(f"eval.tasks: cannot read {path}: {' '.join(str(e).split())}") from None
    where = f"eval.tasks: {path}"
    if not isinstance(cfg, dict):
        raise TaskError(f"{where}: expected a mapping of lm-eval task keys")
    unknown = sorted(set(cfg) - _READ - _DESCRIPTIVE)
    if unknown:
        raise TaskError(
            f"{where}: {', '.join(unknown)} not supported (titanlite scores zero-shot "
            "multiple-choice tasks over local files: docs/evaluation.md lists the keys)"
        )
    _require(cfg, "output_type", "multiple_choice", where)
    _require(cfg, "dataset_path", "json", where)
    if cfg.get("num_fewshot", 0) != 0:
        raise TaskError(f"{where}: num_fewshot = {cfg['num_fewshot']}; only zero-shot is built")
    metrics = [m.get("metric") if isinstance(m, dict) else m for m in cfg.get("metric_list", [])]
    if any(m not in METRICS for m in metrics):
        raise TaskError(f"{where}: metric_list {metrics}: only {', '.join(METRICS)} are scored")
    data = _data_file(cfg, path, where)
    examples = []
    for line, doc in _yaml_docs(data, where):
        at = f"{where} ({data.name} line {line})"
        text = _text(cfg.get("doc_to_text"), doc, "doc_to_text", at)
        choices = _choices(cfg.get("doc_to_choice"), doc, at)
        gold = _target(cfg.get("doc_to_target"), doc, at)
        description = cfg.get("description", "")
        if description:  # lm-eval renders it over the document too
            description = _render(str(description), doc, "description", at)
        examples.append(_example(description + text, choices, gold, at))
    delimiter = cfg.get("target_delimiter", " ")
    if not isinstance(delimiter, str):
        raise TaskError(f"{where}: target_delimiter must be text, not {delimiter!r}")
    return Task(str(cfg.get("task", path.stem)), tuple(examples), delimiter)


def _require(cfg: dict[str, Any], key: str, value: str, where: str) -> None:
    if cfg.get(key) != value:
        raise TaskError(
            f"{where}: {key} = {cfg.get(key)!r}; titanlite scores {key} = {value!r} tasks "
            "(local files, no hub access at run time)"
        )


def _data_file(cfg: dict[str, Any], path: Path, where: str) -> Path:
    split = cfg.get("test_split") or cfg.get("validation_split")
    files = (cfg.get("dataset_kwargs") or {}).get("data_files")
    if isinstance(files, dict):
        files = files.get(split)
    if isinstance(files, list) and len(files) == 1:
        files = files[0]
    if not split or not isinstance(files, str):
        raise TaskError(
            f"{where}: expected test_split (or validation_split) and one "
            "dataset_kwargs.data_files file for it"
        )
    data = Path(files)
    return data if data.is_absolute() else path.parent / data


def _yaml_docs(data: Path, where: str) -> list[tuple[int, dict[str, Any]]]:
    if not data.is_file():
        raise TaskError(f"{where}: its data file {data} does not exist")
    if data.suffix == ".json":
        try:
            rows = json.loads(data.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise TaskError(f"{where}: cannot read {data}: {e}") from None
        if not (isinstance(rows, list) and all(isinstance(r, dict) for r in rows)):
            raise TaskError(f"{where}: {data} must hold a JSON list of objects")
        return list(enumerate(rows, 1))
    return _read_jsonl(data)


@functools.cache
def _jinja() -> Any:
    """lm-eval's template environment (its utils.py), made once."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.BaseLoader(), undefined=jinja2.StrictUndefined, keep_trailing_newline=True
    )
    env.filters["regex_replace"] = lambda s, p, r, count=0: re.sub(p, r, s, count=count)
    return env


def _render(template: str, doc: dict[str, Any], key: str, where: str) -> str:
    import jinja2

    try:
        return _jinja().from_string(template).render(**doc)
    except jinja2.TemplateError as e:
        raise TaskError(f"{where}: {key} {template!r}: {e}") from None


def _text(spec: Any, doc: dict[str, Any], key: str, where: str) -> str:
    if not isinstance(spec, str):
        raise TaskError(f"{where}: {key} must be a field name or a template, not {spec!r}")
    return doc[spec] if spec in doc else _render(spec, doc, key, where)


def _choices(spec: Any, doc: dict[str, Any], where: str) -> Any:
    if isinstance(spec, list):
        return spec
    if isinstance(spec, dict):
        return list(spec.values())
    if isinstance(spec, str) and spec in doc:
        return doc[spec]
    rendered = _text(spec, doc, "doc_to_choice", where)
    try:
        return ast.literal_eval(rendered)
    except (ValueError, SyntaxError):
        raise TaskError(f"{where}: doc_to_choice gave {rendered!r}, not a list") from None


def _target(spec: Any, doc: dict[str, Any], where: str) -> Any:
    if isinstance(spec, int) and not isinstance(spec, bool):
        return spec
    if isinstance(spec, str) and spec in doc:
        return doc[spec]
    rendered = _text(spec, doc, "doc_to_target", where)
    return ast.literal_eval(rendered) if rendered.isdigit() else rendered
