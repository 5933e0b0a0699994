"""Every integer knob states its range, and the loader holds each to it (issue 46, item 4)."""

import dataclasses
import typing

import pytest

from titanlite.config import loader as config
from titanlite.config import schema
from titanlite.config.loader import ConfigError


def _records(cls: type) -> typing.Iterator[type]:
    """`cls` and every dataclass its fields hold (sections, [[data.sources]] records, ...)."""
    yield cls
    for tp in typing.get_type_hints(cls).values():
        for inner in (tp, *typing.get_args(tp)):
            if dataclasses.is_dataclass(inner):
                yield from _records(inner)


def _integer_fields() -> list[tuple[type, dataclasses.Field]]:
    out = []
    for cls in dict.fromkeys(_records(schema.JobConfig)):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if int in (hints[f.name], *typing.get_args(hints[f.name])):
                out.append((cls, f))
    return out


# What the largest value of a field needs of another to load (cross-field checks).
_WITH = {
    "global_batch_size": ["--training.local_batch_size", "1"],
    "seq_len": ["--training.seq_len", str(schema.SEQ_MAX)],
    "ns_steps": ["--optimizer.name", "Muon"],  # a Muon setting, refused under AdamW
}


def _section_fields() -> list[tuple[str, dataclasses.Field]]:
    """(section, field) of the integer fields a --section.key flag sets."""
    sections = {
        type(getattr(schema.JobConfig(), f.name)): f.name
        for f in dataclasses.fields(schema.JobConfig)
    }
    return [(sections[cls], f) for cls, f in _integer_fields() if cls in sections]


def test_every_integer_field_states_a_range_holding_its_default():
    fields = _integer_fields()
    assert len(fields) >= 35, [f.name for _, f in fields]  # the walk found them all
    for cls, f in fields:
        meta, name = f.metadata, f"{cls.__name__}.{f.name}"
        assert isinstance(meta.get("min"), int) and isinstance(meta.get("max"), int), name
        assert meta["min"] <= meta["max"] <= 2**63 - 1, name
        sentinel = meta.get("sentinel", (None, ""))[0]
        default = f.default
        assert default is None or default == sentinel or meta["min"] <= default <= meta["max"], name


@pytest.mark.parametrize("section, f", _section_fields(), ids=lambda x: getattr(x, "name", x))
def test_each_integer_flag_is_refused_past_either_end(section, f):
    flag = f"--{section}.{f.name}"
    low, high = f.metadata["min"], f.metadata["max"]
    sentinel = f.metadata.get("sentinel", (None, ""))[0]
    for value, says in (
        (high + 1, f"must be <= {high}"),
        (10**30, f"out of range; must be within [{low}, {high}]"),
        (low - 1 if low - 1 != sentinel else low - 2, f">= {low}"),
    ):
        with pytest.raises(ConfigError) as e:
            config.load([flag, str(value)])
        assert f"[{section}] {f.name} = {value}" in str(e.value) and says in str(e.value)
    largest = config.load([*_WITH.get(f.name, []), flag, str(high)])
    assert getattr(getattr(largest, section), f.name) == high
    if sentinel is not None:
        assert getattr(getattr(config.load([flag, str(sentinel)]), section), f.name) == sentinel
