"""The data checks: the datasets opened (text files listed, prepared shards checked against the
tokenizer) and at least one window of tokens in each."""

from __future__ import annotations

from pathlib import Path

from titanlite.config.schema import JobConfig


def open_datasets(job: JobConfig, tokenizer):
    """The training DataSource (or Mixture) and the validation one (None when it is off)."""
    from titanlite.data import open_dataset, resolve_dataset_path

    t = job.training
    if job.data.sources:
        dataset = open_mixture(job, tokenizer)
    else:
        dataset = open_dataset(resolve_dataset_path(t.dataset, t.dataset_path), tokenizer)
    validation = None
    if job.validation.enabled:
        assert job.validation.dataset_path is not None  # config.validate requires it
        validation = open_dataset(
            Path(job.validation.dataset_path), tokenizer, "validation.dataset_path"
        )
    return dataset, validation


def open_mixture(job: JobConfig, tokenizer):
    """The [[data.sources]] as a Mixture: each source's prepared shards checked against the
    tokenizer (so sources of different tokenizers, or with ids past the vocabulary, are each
    one line naming the source)."""
    from titanlite.data import DatasetError, ShardSet, open_dataset
    from titanlite.data.mixture import Mixture

    d = job.data
    shards = []
    for source in d.sources:
        key = f"data.sources.{source.name}.path"
        opened = open_dataset(Path(source.path), tokenizer, key)
        if not isinstance(opened, ShardSet):
            raise DatasetError(
                f"{key} = {source.path!r} holds text; a mixture reads prepared shards (text "
                "sources are not built yet): prepare it with python -m titanlite.data.prepare"
            )
        shards.append(opened)
    names = [s.name for s in d.sources]
    phases = [(1, [s.weight for s in d.sources])]
    phases += [(p.start_step, [p.weights.get(n, 0.0) for n in names]) for p in d.phases]
    repetition = [s.max_repetition for s in d.sources]
    return Mixture(names, shards, phases, repetition, d.weight_unit, d.allow_mixture_change)


def check_windows(job: JobConfig, dataset, validation, tokenizer, global_batch: int) -> None:
    from titanlite.data.mixture import Mixture

    t = job.training
    if isinstance(dataset, Mixture):
        for shards in dataset.shards:
            check_first_window(shards, tokenizer, t.seq_len, t.dataset_text_field, "training")
        dataset.check_finite(t.steps, global_batch, t.seq_len)
    else:
        check_first_window(dataset, tokenizer, t.seq_len, t.dataset_text_field, "training")
    if validation is not None:
        v = job.validation
        check_first_window(
            validation, tokenizer, v.seq_len or t.seq_len, t.dataset_text_field, "validation"
        )


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
