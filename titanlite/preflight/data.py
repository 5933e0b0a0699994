"""The data checks: the datasets opened (text files listed, prepared shards checked against the
tokenizer) and at least one window of tokens in each."""

from __future__ import annotations

from pathlib import Path

from titanlite.config.schema import JobConfig


def open_datasets(job: JobConfig, tokenizer):
    """The training DataSource (or Mixture) and the held-out ones by name ("" for
    validation.dataset_path; none when validation is off)."""
    from titanlite.data import open_dataset, resolve_dataset_path

    t = job.training
    if job.data.sources:
        dataset = open_mixture(job, tokenizer)
    else:
        dataset = open_dataset(resolve_dataset_path(t.dataset, t.dataset_path), tokenizer)
    validation = {}
    if job.validation.enabled:
        for name, path, key in validation_paths(job):
            validation[name] = open_dataset(Path(path), tokenizer, key)
    return dataset, validation


def validation_paths(job: JobConfig) -> list[tuple[str, str, str]]:
    """(name, path, config key) of each held-out set: validation.dataset_path as "", or the
    [[validation.sources]] by their names."""
    v = job.validation
    if v.sources:
        return [(s.name, s.path, f"validation.sources.{s.name}.path") for s in v.sources]
    assert v.dataset_path is not None  # config.validate requires one of them
    return [("", v.dataset_path, "validation.dataset_path")]


def open_mixture(job: JobConfig, tokenizer):
    """The [[data.sources]] as a Mixture: each source opened as training.dataset_path is, its
    text files listed or its prepared shards checked against the tokenizer (so sources of
    different tokenizers, or with ids past the vocabulary, are each one line naming the
    source)."""
    from titanlite.data import open_dataset

    opened = [
        open_dataset(Path(s.path), tokenizer, f"data.sources.{s.name}.path")
        for s in job.data.sources
    ]
    return mixture_of(job, opened)


def mixture_of(job: JobConfig, opened: list):
    """The Mixture of the [[data.sources]] (and [[data.phases]]), given each source's data."""
    from titanlite.data.mixture import Mixture

    d = job.data
    names = [s.name for s in d.sources]
    phases = [(1, [s.weight for s in d.sources])]
    phases += [(p.start_step, [p.weights.get(n, 0.0) for n in names]) for p in d.phases]
    repetition = [s.max_repetition for s in d.sources]
    return Mixture(names, opened, phases, repetition, d.weight_unit, d.allow_mixture_change)


def check_windows(
    job: JobConfig, dataset, validation, tokenizer, global_batch: int, finite: bool = True
) -> None:
    """Every source, held-out set included, holds a first window; with `finite`, no mixture
    source is read past its max_repetition."""
    from titanlite.data import ShardSet
    from titanlite.data.mixture import Mixture

    t = job.training
    if isinstance(dataset, Mixture):
        for name, data in zip(dataset.names, dataset.sources):
            # (Prepared shards' errors name their source's key themselves.)
            what = "training" if isinstance(data, ShardSet) else f"data.sources.{name}.path's"
            check_first_window(data, tokenizer, t.seq_len, t.dataset_text_field, what)
        if finite:
            dataset.check_finite(t.steps, global_batch, t.seq_len)
    else:
        check_first_window(dataset, tokenizer, t.seq_len, t.dataset_text_field, "training")
    v = job.validation
    for name, source in validation.items():
        what = f"validation set {name!r}" if name else "validation"
        check_first_window(source, tokenizer, v.seq_len or t.seq_len, t.dataset_text_field, what)


def check_first_window(source, tokenizer, seq_len: int, text_field: str, what: str) -> None:
    """The data holds at least one window of seq_len + 1 tokens. Prepared shards say so in their
    manifest; text is read and tokenized from the start only until one window is full (a normal
    corpus costs a few documents; one whose every record is malformed is read to the end)."""
    from titanlite.data import DatasetError, ShardSet
    from titanlite.data.documents import SkippedRecords, iter_documents

    need = seq_len + 1
    if isinstance(source, ShardSet):
        if source.num_windows(seq_len) == 0:
            raise DatasetError(
                f"{source.key}: {source.manifest_file} holds {source.total_tokens} tokens, fewer "
                f"than one window of {what} seq_len + 1 = {need}; prepare more data"
            )
        return
    skipped, tokens, docs, batch = SkippedRecords(), 0, 0, []
    for _, _, text in iter_documents(source, text_field, 0, 0, skipped):
        docs += 1
        batch.append(text)
        if sum(map(len, batch)) >= need or len(batch) >= 64:
            tokens += sum(map(len, tokenizer.encode_documents(batch)))
            batch = []
            if tokens >= need:
                return
    tokens += sum(map(len, tokenizer.encode_documents(batch))) if batch else 0
    if tokens >= need:
        return
    where = f"{what} data ({len(source)} file(s), first {source[0]})"
    if docs == 0:
        example = f", e.g. {skipped.examples[0]}" if skipped.examples else ""
        raise DatasetError(
            f"{where}: no readable document; {skipped.count} malformed record(s){example}"
        )
    raise DatasetError(
        f"{where}: holds {tokens} tokens, fewer than one window of seq_len + 1 = {need}; "
        "add data or lower the seq_len"
    )
