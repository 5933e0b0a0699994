"""The config's arrays of tables, `[[data.sources]]`, `[[data.phases]]` and
`[[validation.sources]]`, read into their typed records, the command line's
`--data.sources.<name>.<field> value`, and the checks that span the tables (docs/data.md)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from titanlite.config.errors import ConfigError
from titanlite.config.schema import (
    Data,
    MixturePhase,
    MixtureSource,
    Validation,
    ValidationSource,
)

# (record class, field, raw value, where, from_cli) -> the checked value
CheckedValue = Callable[[type, dataclasses.Field, Any, str, bool], Any]
# (section, key) -> the record of one of its tables
RECORDS: dict[tuple[str, str], type] = {
    ("data", "sources"): MixtureSource,
    ("data", "phases"): MixturePhase,
    ("validation", "sources"): ValidationSource,
}


def read_tables(raw: Any, section: str, key: str, origin: str, checked: CheckedValue) -> list[Any]:
    """The `[[<section>.<key>]]` tables as records; one line naming the table and key if
    wrong."""
    cls, table_name = RECORDS[(section, key)], f"{section}.{key}"
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        raise ConfigError(f"{origin}: {table_name} must be an array of tables ([[{table_name}]])")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    records = []
    for i, table in enumerate(raw, 1):
        where = f"{origin}: [[{table_name}]] #{i}"
        unknown = sorted(set(table) - set(fields))
        if unknown:
            raise ConfigError(f"{where}: unknown key {unknown[0]!r} (keys: {', '.join(fields)})")
        values = {k: checked(cls, fields[k], v, f"{where} {k}", False) for k, v in table.items()}
        records.append(cls(**values))
    return records


def set_source_field(
    section: str, sources: list[Any], key: str, raw: Any, origin: str, checked: CheckedValue
) -> None:
    """`--<section>.sources.<name>.<field> value`: one field of the source named <name>."""
    cls = RECORDS[(section, "sources")]
    _, name, field_name = (key.split(".", 2) + ["", ""])[:3]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if not name or field_name not in fields or field_name == "name":
        raise ConfigError(
            f"{origin}: expected --{section}.sources.<name>.<field> with a field among "
            f"{', '.join(f for f in fields if f != 'name')}"
        )
    by_name = {s.name: s for s in sources}
    if name not in by_name:
        known = ", ".join(by_name) or f"none: the config has no [[{section}.sources]]"
        raise ConfigError(f"{origin}: no source named {name!r} (sources: {known})")
    value = checked(cls, fields[field_name], raw, origin, True)
    setattr(by_name[name], field_name, value)


def check_data(data: Data, steps: int, dataset_path: str | None) -> None:
    """What spans the tables: names, paths, weights, phases (before anything is built)."""
    if not data.sources:
        if data.phases:
            raise ConfigError("[[data.phases]] needs [[data.sources]] to weigh")
        return
    if dataset_path:
        raise ConfigError(
            "training.dataset_path and [[data.sources]] are both set: a mixture names its "
            "sources' paths; drop training.dataset_path (or the sources)"
        )
    names = _check_names("data", data.sources)
    _check_weights("[[data.sources]]", {s.name: s.weight for s in data.sources})
    previous = 1
    for phase in data.phases:
        where = f"[[data.phases]] start_step = {phase.start_step}"
        if phase.start_step <= previous:
            raise ConfigError(
                f"{where}: phases must start after step 1 and in increasing order (the "
                "sources' own weights are the phase from step 1)"
            )
        if phase.start_step > steps:
            raise ConfigError(
                f"{where} is past training.steps = {steps}: the phase would never run"
            )
        unknown = sorted(set(phase.weights) - set(names))
        if unknown:
            raise ConfigError(
                f"{where}: weights name {unknown[0]!r}, which is no source (sources: "
                f"{', '.join(names)})"
            )
        _check_weights(where, {n: phase.weights.get(n, 0.0) for n in names})
        previous = phase.start_step


def _check_weights(where: str, weights: dict[str, float]) -> None:
    for name, weight in weights.items():
        if not math.isfinite(weight) or weight < 0:
            raise ConfigError(f"{where}: weight of {name!r} is {weight}; weights are >= 0")
    if not any(weights.values()):
        raise ConfigError(f"{where}: every weight is 0; give at least one source a weight")


def check_validation_sources(validation: Validation) -> None:
    """Named held-out sets: each with a name of its own and a path; not with dataset_path."""
    if not validation.sources:
        return
    if validation.dataset_path:
        raise ConfigError(
            "validation.dataset_path and [[validation.sources]] are both set: name the "
            "held-out set among the sources (or drop the sources)"
        )
    _check_names("validation", validation.sources)


def _check_names(section: str, sources: list[Any]) -> list[str]:
    """Each of `[[<section>.sources]]` has a name of its own and a path; their names."""
    names = [s.name for s in sources]
    for i, source in enumerate(sources, 1):
        if not source.name:
            raise ConfigError(f"[[{section}.sources]] #{i} has no name; give each source a name")
        if not source.path:
            raise ConfigError(f"[[{section}.sources]] {source.name!r} has no path")
        if names.count(source.name) > 1:
            raise ConfigError(f"[[{section}.sources]]: two sources are named {source.name!r}")
    return names
