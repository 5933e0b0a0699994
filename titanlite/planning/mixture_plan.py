"""The data mixture's plan in a dry run, for a cluster whose data may not be here: each
source's target and achieved share over training.steps and its tokens follow from the config
alone (the weights, phases and the global batch); its epochs need its size, known for a
prepared source whose manifest is readable here and unknown otherwise (a text source, which
would have to be tokenized, or a path that exists only on the cluster)."""

from __future__ import annotations

from pathlib import Path

from titanlite.config.schema import JobConfig
from titanlite.data import DatasetError, ShardSet
from titanlite.data.mixture import describe
from titanlite.data.shards import is_prepared
from titanlite.preflight.data import mixture_of


def mixture_plan(job: JobConfig, windows_per_step: int) -> tuple[str, str | None] | None:
    """The plan's lines and the refusal training's preflight would make of it (None: none);
    None without [[data.sources]]. A source read past its max_repetition is marked in the
    plan, which is printed whole before the dry run exits with the refusal; a plan that needs
    sizes not here is a line of the text."""
    if not job.data.sources:
        return None
    known = [_manifest_here(s.path, f"data.sources.{s.name}.path") for s in job.data.sources]
    t = job.training
    try:
        mixture = mixture_of(job, [shards if shards else [] for shards in known])
        rows = mixture.plan(t.steps, windows_per_step, t.seq_len)
    except DatasetError as e:
        return f"data mixture: not planned: {e}", None
    lines = [describe(rows, unknown="unknown (not read here)")]
    for row, source in zip(rows, job.data.sources):
        if row.exhausted_at is not None:
            lines.append(
                f"  OVERRUN: {row.name} would be read {row.epochs:.2f} times, past "
                f"max_repetition = {source.max_repetition:g} at step {row.exhausted_at}: "
                "training refuses it"
            )
    try:
        mixture.check_finite(t.steps, windows_per_step, t.seq_len)
    except DatasetError as e:
        return "\n".join(lines), str(e)
    return "\n".join(lines), None


def _manifest_here(path: str, key: str) -> ShardSet | None:
    """The source's prepared shards if their manifest is readable here, else None."""
    try:
        return ShardSet(Path(path), key) if is_prepared(Path(path)) else None
    except DatasetError:
        return None
