"""Load a JobConfig from TOML and command-line overrides (CLI > TOML > defaults).

Every mistake a user can make here raises ConfigError with one line that names where the value
came from, the section and key, the bad value and what was expected. Nothing heavy (torch,
process groups, models) is touched, so errors come before any expensive work.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.resources
import math
import os
import sys
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

from titanlite.config import mixture_tables as tables
from titanlite.config.errors import ConfigError
from titanlite.config.schema import (
    FIXED_KEYS,
    IGNORED_KEYS,
    RENAMED_KEYS,
    RENAMED_SECTIONS,
    UNIMPLEMENTED_SECTIONS,
    JobConfig,
)
from titanlite.core.io import atomic_write_text, special_kind
from titanlite.core.logging import logger
from titanlite.core.numbers import INT64_MAX, INT64_MIN

# Integers reach tensors, C++ (the process group's timeouts) and the clock: 64-bit signed, a
# fence before each field's own [min, max].


class IntegerOutOfRange(ValueError):
    """An integer beyond 64 bits."""


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _closest(name: str, options: typing.Iterable[str]) -> str:
    match = difflib.get_close_matches(name, list(options), n=1, cutoff=0.5)
    return f" (did you mean '{match[0]}'?)" if match else ""


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _type_name(tp: Any) -> str:
    base, optional = _strip_optional(tp)
    if typing.get_origin(base) is list:
        name = f"a list of {typing.get_args(base)[0].__name__} (comma-separated on the CLI)"
    else:
        name = {
            bool: "true or false",
            int: "an integer",
            float: "a finite number",
            str: "a string",
        }[base]
    return name + (" or none" if optional else "")


def _coerce(value: Any, tp: Any, from_cli: bool) -> Any:
    """Convert a TOML or CLI value to the field type; ValueError if it is not one."""
    base, optional = _strip_optional(tp)
    if optional and (value is None or (from_cli and str(value).lower() in ("none", "null"))):
        return None
    if typing.get_origin(base) is dict:
        if not isinstance(value, dict):
            raise ValueError
        value_tp = typing.get_args(base)[1]
        return {str(k): _coerce(v, value_tp, from_cli) for k, v in value.items()}
    if typing.get_origin(base) is list:
        item_tp = typing.get_args(base)[0]
        # TorchTitan's TOMLs write lists as comma-separated strings too (filter_fqns = 'output').
        if from_cli or isinstance(value, str):
            value = [v.strip() for v in str(value).split(",") if v.strip()]
        if not isinstance(value, list):
            raise ValueError
        return [_coerce(v, item_tp, from_cli) for v in value]
    if base is bool:
        if isinstance(value, bool):
            return value
        if from_cli and str(value).lower() in _TRUE | _FALSE:
            return str(value).lower() in _TRUE
        raise ValueError
    if base is int:
        if isinstance(value, bool) or not isinstance(value, int) and not from_cli:
            raise ValueError
        whole = value if isinstance(value, int) else int(str(value), 0)
        if not INT64_MIN <= whole <= INT64_MAX:
            raise IntegerOutOfRange
        return whole
    if base is float:
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, (int, float)):
            number = float(value)
        elif from_cli:
            number = float(str(value))
        else:
            raise ValueError
        # TOML and float() both accept nan and inf; no titanlite setting means anything by them.
        if not math.isfinite(number):
            raise ValueError
        return number
    if base is str:
        if isinstance(value, str):
            return value
        # TOML writes `selective_ac_option = 2` as well as '2'.
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        raise ValueError
    raise TypeError(f"unsupported config field type {tp}")


def _set(cfg: JobConfig, section: str, key: str, raw: Any, origin: str, from_cli: bool) -> None:
    if (section, key) in RENAMED_KEYS:
        new_section, new_key = RENAMED_KEYS[(section, key)]
        note(
            f"{origin}: [{section}] {key} is TorchTitan's name; titanlite spells it "
            f"[{new_section}] {new_key}"
        )
        section, key = new_section, new_key
    elif (section, key) in FIXED_KEYS:
        fixed = FIXED_KEYS[(section, key)]
        value = _coerce(raw, list[str], from_cli) if isinstance(fixed, list) else raw
        if (sorted(value) if isinstance(fixed, list) else value) != (
            sorted(fixed) if isinstance(fixed, list) else fixed
        ):
            raise ConfigError(
                f"{origin}: [{section}] {key} = {raw!r}: titanlite supports only {fixed!r}"
            )
        return
    elif (section, key) in IGNORED_KEYS:
        note(f"{origin}: [{section}] {key} = {raw!r} is ignored: {IGNORED_KEYS[(section, key)]}")
        return
    where = f"{origin}: [{section}] {key}"
    if not hasattr(cfg, section):
        options = [f.name for f in dataclasses.fields(JobConfig)]
        raise ConfigError(f"{origin}: unknown section [{section}]{_closest(section, options)}")
    sec = getattr(cfg, section)
    fields = {f.name: f for f in dataclasses.fields(sec)}
    if (section, key) in tables.RECORDS:
        setattr(sec, key, tables.read_tables(raw, section, key, origin, _checked_value))
        return
    if (section, "sources") in tables.RECORDS and key.startswith("sources."):
        # --data.sources.<name>.<field>, --validation.sources.<name>.<field>
        tables.set_source_field(section, sec.sources, key, raw, origin, _checked_value)
        return
    if key not in fields:
        raise ConfigError(f"{origin}: unknown key '{key}' in [{section}]{_closest(key, fields)}")
    value = _checked_value(type(sec), fields[key], raw, where, from_cli)
    setattr(sec, key, value)


def _checked_value(cls: type, f: dataclasses.Field, raw: Any, where: str, from_cli: bool) -> Any:
    """`raw` as field `f` of dataclass `cls` takes it: coerced to its type and checked against
    its choices and bounds; ConfigError naming `where` otherwise."""
    tp = _field_types(cls)[f.name]
    choices = f.metadata.get("choices")
    if choices is not None and raw in choices:
        # A choice spelled "none" is that choice, not the unset None of an optional field
        # (--model.moe_load_balance none was read as "the flavor's default").
        tp = _strip_optional(tp)[0]
    try:
        value = _coerce(raw, tp, from_cli)
    except IntegerOutOfRange:
        low, high = f.metadata.get("min", INT64_MIN), f.metadata.get("max", INT64_MAX)
        raise ConfigError(
            f"{where} = {raw}: out of range; must be within [{low}, {high}]"
        ) from None
    except ValueError:
        raise ConfigError(f"{where} = {raw!r}: expected {_type_name(tp)}") from None
    meta = f.metadata
    if choices is not None:
        shown = ", ".join(repr(c) for c in choices)
        if not isinstance(value, list) and value not in choices:
            raise ConfigError(f"{where} = {value!r}: expected one of {shown}")
        for item in value if isinstance(value, list) else []:
            if item not in choices:
                raise ConfigError(
                    f"{where} = {value!r}: {item!r} is not one of {shown}{_closest(item, choices)}"
                )
    low = meta.get("min")
    sentinel, meaning = meta.get("sentinel", (None, ""))
    if sentinel is not None and value == sentinel:
        return value
    if low is not None and value is not None and value < low:
        if sentinel is not None:
            raise ConfigError(f"{where} = {value!r}: expected {sentinel} ({meaning}) or >= {low}")
        raise ConfigError(f"{where} = {value!r}: must be >= {low}")
    high = meta.get("max")
    if high is not None and value is not None and value > high:
        raise ConfigError(f"{where} = {value!r}: must be <= {high}")
    if meta.get("unsupported") and value != _default(f):
        raise ConfigError(
            f"{where} = {value!r}: not supported by titanlite yet; remove it or set it back to "
            f"{_default(f)!r}"
        )
    return value


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def note(message: str) -> None:
    """A one-line note on stderr, once per launch (the preflight and rank 0, not every rank)."""
    if os.environ.get("RANK", "0") == "0" and os.environ.get("TITANLITE_NOTES", "1") != "0":
        print(f"titanlite: note: {message}", file=sys.stderr)


def _flatten_tables(data: dict[str, Any]) -> dict[str, Any]:
    """TorchTitan's nested tables ([quantize.linear.float8]) under the dotted name titanlite
    maps; other sections as they are."""
    out = dict(data)
    for dotted in RENAMED_SECTIONS:
        head, *rest = dotted.split(".")
        node = out.get(head)
        for part in rest:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            out[dotted] = node
            parent = out[head]
            for part in rest[:-1]:
                parent = parent[part]
            del parent[rest[-1]]
            if not _has_values(out[head]):
                del out[head]
    return out


def _has_values(table: Any) -> bool:
    return not isinstance(table, dict) or any(_has_values(v) for v in table.values())


def _apply_toml(cfg: JobConfig, data: dict[str, Any], origin: str) -> None:
    for section, body in _flatten_tables(data).items():
        if section in UNIMPLEMENTED_SECTIONS:
            _check_unimplemented(section, body, origin)
            continue
        if not isinstance(body, dict):
            raise ConfigError(f"{origin}: '{section}' must be a [section] table, got {body!r}")
        if section in RENAMED_SECTIONS:
            new = RENAMED_SECTIONS[section]
            note(f"{origin}: [{section}] is TorchTitan's name; titanlite spells it [{new}]")
            section = new
        for key, value in body.items():
            _set(cfg, section, key, value, origin, from_cli=False)


def _check_unimplemented(section: str, body: Any, origin: str) -> None:
    for key, default in UNIMPLEMENTED_SECTIONS[section].items():
        if isinstance(body, dict) and key in body and body[key] != default:
            raise ConfigError(
                f"{origin}: [{section}] {key} = {body[key]!r}: the [{section}] section is not "
                f"supported by titanlite yet; remove it or set {key} = {default!r}"
            )


def parse_cli(argv: list[str], cfg: JobConfig) -> list[tuple[str, str, Any]]:
    """Turn `--section.key value`, `--section.key=value` and bare `--section.flag` into
    (section, key, raw value) triples; --config is handled by the caller."""
    out: list[tuple[str, str, Any]] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--") or "." not in arg:
            raise ConfigError(
                f"command line: unexpected argument {arg!r}; overrides look like --section.key value"
            )
        name, eq, text = arg[2:].partition("=")
        section, _, key = name.partition(".")
        value: Any = text
        if not eq:
            tp = _cli_field_type(cfg, section, key)
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            is_bool = _strip_optional(tp)[0] is bool if tp is not None else False
            if is_bool and (
                nxt is None or nxt.startswith("--") or nxt.lower() not in _TRUE | _FALSE
            ):
                value = True
            elif nxt is None or nxt.startswith("--"):
                raise ConfigError(f"command line: --{name} needs a value")
            else:
                value = nxt
                i += 1
        out.append((section, key, value))
        i += 1
    return out


def _cli_field_type(cfg: JobConfig, section: str, key: str) -> Any:
    sec = getattr(cfg, section, None)
    if sec is None or not dataclasses.is_dataclass(sec):
        return None
    return _field_types(type(sec)).get(key)


def split_config_arg(argv: list[str]) -> tuple[str | None, list[str]]:
    """Pull `--config PATH` / `--config=PATH` out of argv."""
    path, rest, i = None, [], 0
    while i < len(argv):
        if argv[i] == "--config":
            if i + 1 >= len(argv):
                raise ConfigError("command line: --config needs a path")
            path = argv[i + 1]
            i += 2
            continue
        if argv[i].startswith("--config="):
            path = argv[i].split("=", 1)[1]
        else:
            rest.append(argv[i])
        i += 1
    return path, rest


def resolve_config_path(path: str) -> Path:
    """A bare preset name (`llama_8b.toml`) means the one in train_configs/: installed with the
    package as titanlite/presets/ (pyproject.toml maps the folder there), or a checkout's own."""
    p = Path(path)
    if p.exists():
        return p
    if len(p.parts) == 1:
        installed = importlib.resources.files("titanlite") / "presets" / p.name
        checkout = Path(__file__).resolve().parents[2] / "train_configs" / p.name
        for preset in (installed, checkout):
            if isinstance(preset, Path) and preset.exists():
                return preset
    raise ConfigError(f"config file {path} does not exist; pass a path or a name in train_configs/")


def load(argv: list[str]) -> JobConfig:
    """Build the JobConfig for `--config PATH [--section.key value ...]`."""
    cfg = JobConfig()
    path, rest = split_config_arg(argv)
    if path is not None:
        cfg_path = resolve_config_path(path)
        if cfg_path.is_dir():
            raise ConfigError(
                f"--config {path}: {cfg_path} is a folder; pass a .toml file (presets are in "
                "train_configs/)"
            )
        if kind := special_kind(cfg_path):  # reading a FIFO would wait forever
            raise ConfigError(f"--config {path}: {cfg_path} is {kind}; pass a .toml file")
        try:
            data = tomllib.loads(cfg_path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as e:
            raise ConfigError(
                f"{cfg_path}: not UTF-8 text (byte {e.start}: {e.reason}); TOML files are UTF-8"
            ) from None
        except OSError as e:
            raise ConfigError(f"{cfg_path}: cannot read it ({e.strerror})") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{cfg_path}: not valid TOML: {e}") from None
        _apply_toml(cfg, data, str(cfg_path))
        cfg.job.config_file = str(cfg_path)
    for section, key, value in parse_cli(rest, cfg):
        _set(cfg, section, key, value, f"command line (--{section}.{key})", from_cli=True)
    validate(cfg)
    return cfg


def validate(cfg: JobConfig) -> None:
    """Checks that involve several keys; layout checks that need the world size live in
    parallelisms.parallel_dims."""
    for check in (
        _check_schedule_and_batch,
        _check_activation_checkpoint,
        _check_float8,
        _check_validation,
        _check_optimizer,
    ):
        check(cfg)
    tables.check_data(cfg.data, cfg.training.steps, cfg.training.dataset_path)


def _check_schedule_and_batch(cfg: JobConfig) -> None:
    t, lr = cfg.training, cfg.lr_scheduler
    if lr.decay_ratio is not None and lr.decay_ratio > 1:
        raise ConfigError(f"[lr_scheduler] decay_ratio = {lr.decay_ratio}: must be within [0, 1]")
    if lr.lr_min > 1:
        raise ConfigError(
            f"[lr_scheduler] lr_min = {lr.lr_min}: it is a fraction of optimizer.lr, within [0, 1]"
        )
    if t.global_batch_size != -1 and t.global_batch_size % t.local_batch_size:
        raise ConfigError(
            f"[training] global_batch_size = {t.global_batch_size} is not a multiple of "
            f"local_batch_size = {t.local_batch_size}"
        )


_MUON_ONLY = (
    "momentum",
    "nesterov",
    "ns_steps",
    "ns_coefficients",
    "muon_eps",
    "muon_ns_dtype",
    "adjust_lr_fn",
    "adamw_lr",
    "adamw_weight_decay",
    "muon_exclude",
)


def _check_optimizer(cfg: JobConfig) -> None:
    o, default = cfg.optimizer, type(cfg.optimizer)()
    if o.name != "Muon":
        for key in _MUON_ONLY:
            if getattr(o, key) != getattr(default, key):
                raise ConfigError(
                    f"[optimizer] {key} = {getattr(o, key)!r} is a Muon setting; name = "
                    f"{o.name!r} would ignore it: remove it or set optimizer.name = 'Muon'"
                )
        return
    if not o.momentum < 1:
        raise ConfigError(f"[optimizer] momentum = {o.momentum}: must be within [0, 1)")
    if len(o.ns_coefficients) != 3:
        raise ConfigError(
            f"[optimizer] ns_coefficients = {o.ns_coefficients}: expected 3 numbers (a, b, c)"
        )


def _check_activation_checkpoint(cfg: JobConfig) -> None:
    ac = cfg.activation_checkpoint
    if ac.mode == "selective" and ac.selective_ac_option != "op":
        if not ac.selective_ac_option.isdigit() or int(ac.selective_ac_option) < 1:
            raise ConfigError(
                f"[activation_checkpoint] selective_ac_option = {ac.selective_ac_option!r}: "
                "expected a positive integer (every N-th block) or 'op'"
            )
    if ac.mode == "memory_budget" and not cfg.training.compile:
        raise ConfigError(
            "[activation_checkpoint] mode = 'memory_budget' is torch.compile's choice of what to "
            "recompute and needs training.compile = true (or pick mode 'full' or 'selective')"
        )


def _check_float8(cfg: JobConfig) -> None:
    f8 = cfg.float8
    if (
        "float8" in cfg.model.converters
        and f8.precompute_float8_dynamic_scale_for_fsdp
        and not f8.enable_fsdp_float8_all_gather
    ):
        raise ConfigError(
            "[float8] precompute_float8_dynamic_scale_for_fsdp acts only on weights all-gathered "
            "in float8; set enable_fsdp_float8_all_gather = true or turn it off"
        )


def _check_validation(cfg: JobConfig) -> None:
    v, t = cfg.validation, cfg.training
    tables.check_validation_sources(v)
    if v.enabled and not (v.dataset_path or v.sources):
        raise ConfigError(
            "[validation] enabled = true needs validation.dataset_path (held-out text or prepared "
            "shards) or [[validation.sources]]"
        )
    if v.seq_len is not None and v.seq_len > t.seq_len:
        raise ConfigError(
            f"[validation] seq_len = {v.seq_len} is longer than training.seq_len = {t.seq_len}, "
            "the longest sequence the model's position table covers"
        )


def to_dict(cfg: JobConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def to_toml(cfg: JobConfig) -> str:
    """The resolved config as TOML (None values are left out: TOML has no null)."""
    lines: list[str] = []
    for section, body in to_dict(cfg).items():
        lines.append(f"[{section}]")
        arrays = {k: v for k, v in body.items() if _is_table_array(v)}
        for key, value in body.items():
            if value is not None and key not in arrays:
                lines.append(f"{key} = {_toml_value(value)}")
        lines.append("")
        for key, records in arrays.items():  # [[section.key]] after the section's own keys
            for record in records:
                lines.append(f"[[{section}.{key}]]")
                lines += [f"{k} = {_toml_value(v)}" for k, v in record.items()]
                lines.append("")
    return "\n".join(lines)


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):  # an inline table: { web = 0.5, code = 0.5 }
        return (
            "{ "
            + ", ".join(f"{_toml_value(str(k))} = {_toml_value(x)}" for k, x in v.items())
            + " }"
        )
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def save_resolved(dump_folder: Path, text: str) -> None:
    """`config.toml` in the dump folder: what this run resolved. An earlier run's different
    config is kept beside it (config.<mtime>.toml), never overwritten."""
    dump_folder.mkdir(parents=True, exist_ok=True)
    path = dump_folder / "config.toml"
    if path.exists() and path.read_text() != text:
        stamp = int(path.stat().st_mtime)
        kept = path.with_name(f"config.{stamp}.toml")
        n = 1
        while kept.exists():  # two configs of one second: neither is lost
            kept, n = path.with_name(f"config.{stamp}-{n}.toml"), n + 1
        path.rename(kept)
        logger.info(f"an earlier run's config kept as {kept}")
    atomic_write_text(path, text)
