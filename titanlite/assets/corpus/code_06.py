"""A forgiving parser for INI-style configuration files.

Supported syntax::

    # comments start with '#' or ';'
    [section]
    key = value
    name: value with spaces
    path = ${paths:root}/data     ; interpolation from another section
    long_text = first line
        continued line          ; indented lines continue the previous value

Values are kept as strings; typed accessors convert on demand so that a
typo in one value does not prevent the rest of the file from loading.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

SECTION_RE = re.compile(r"^\[(?P<name>[^\]]+)\]\s*$")
PAIR_RE = re.compile(r"^(?P<key>[^=:\s][^=:]*?)\s*[=:]\s*(?P<value>.*)$")
REF_RE = re.compile(r"\$\{(?:(?P<section>[\w.-]+):)?(?P<key>[\w.-]+)\}")

TRUE_WORDS = {"1", "yes", "true", "on"}
FALSE_WORDS = {"0", "no", "false", "off"}


class ConfigError(Exception):
    def __init__(self, message: str, line: int | None = None) -> None:
        where = f"line {line}: " if line is not None else ""
        super().__init__(where + message)
        self.line = line


@dataclass
class Section:
    name: str
    values: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, key: str) -> str:
        return self.values[key]


def _strip_comment(line: str) -> str:
    # Only treat ';' or '#' as a comment when preceded by whitespace, so that
    # values like "color=#ff0000" survive intact.
    for marker in (" ;", " #", "\t;", "\t#"):
        idx = line.find(marker)
        if idx != -1:
            line = line[:idx]
    return line.rstrip()


class Config:
    def __init__(self) -> None:
        self.sections: dict[str, Section] = {}

    @classmethod
    def from_string(cls, text: str) -> Config:
        config = cls()
        config._parse(text.splitlines())
        return config

    @classmethod
    def from_file(cls, path: str) -> Config:
        with open(path, encoding="utf-8") as handle:
            return cls.from_string(handle.read())

    def _parse(self, lines: list[str]) -> None:
        current = self.sections.setdefault("DEFAULT", Section("DEFAULT"))
        last_key: str | None = None
        for number, raw in enumerate(lines, start=1):
            if not raw.strip() or raw.lstrip()[0] in "#;":
                continue
            if raw[0] in " \t" and last_key is not None:
                continuation = _strip_comment(raw).strip()
                current.values[last_key] += "\n" + continuation
                continue
            if match := SECTION_RE.match(_strip_comment(raw)):
                name = match.group("name").strip()
                current = self.sections.setdefault(name, Section(name))
                last_key = None
                continue
            if match := PAIR_RE.match(raw.rstrip()):
                key = match.group("key").strip().lower()
                # Strip the value first so a leading '#' is data, not a comment.
                current.values[key] = _strip_comment(match.group("value").strip())
                last_key = key
                continue
            raise ConfigError(f"cannot parse {raw.strip()!r}", number)

    def __iter__(self) -> Iterator[str]:
        return (name for name in self.sections if name != "DEFAULT")

    def get(self, section: str, key: str, default: str | None = None) -> str | None:
        raw = self._lookup(section, key.lower())
        if raw is None:
            return default
        return self._interpolate(section, raw, depth=0)

    def _lookup(self, section: str, key: str) -> str | None:
        sec = self.sections.get(section)
        if sec is not None and key in sec.values:
            return sec.values[key]
        # Fall back to DEFAULT so shared settings need only be written once.
        return self.sections["DEFAULT"].values.get(key) if "DEFAULT" in self.sections else None

    def _interpolate(self, section: str, value: str, depth: int) -> str:
        if depth > 10:
            raise ConfigError(f"interpolation too deep in [{section}]")

        def replace(match: re.Match[str]) -> str:
            ref_section = match.group("section") or section
            ref_key = match.group("key").lower()
            raw = self._lookup(ref_section, ref_key)
            if raw is None:
                raise ConfigError(f"unknown reference ${{{match.group(0)[2:-1]}}}")
            return self._interpolate(ref_section, raw, depth + 1)

        return REF_RE.sub(replace, value)

    def get_int(self, section: str, key: str, default: int = 0) -> int:
        value = self.get(section, key)
        return default if value is None else int(value.replace("_", ""))

    def get_float(self, section: str, key: str, default: float = 0.0) -> float:
        value = self.get(section, key)
        return default if value is None else float(value)

    def get_bool(self, section: str, key: str, default: bool = False) -> bool:
        value = self.get(section, key)
        if value is None:
            return default
        lowered = value.strip().lower()
        if lowered in TRUE_WORDS:
            return True
        if lowered in FALSE_WORDS:
            return False
        raise ConfigError(f"[{section}] {key} is not a boolean: {value!r}")

    def get_list(self, section: str, key: str, sep: str = ",") -> list[str]:
        value = self.get(section, key) or ""
        parts = value.replace("\n", sep).split(sep)
        return [part.strip() for part in parts if part.strip()]


SAMPLE = """
; shared defaults
log_level = info

[paths]
root = /srv/app
data = ${root}/data
cache: ${paths:root}/cache

[server]
port = 8_080
debug = no
theme = #334455   ; accent colour
hosts = alpha, beta,
    gamma
"""

if __name__ == "__main__":
    cfg = Config.from_string(SAMPLE)
    print("sections:", list(cfg))
    print("data dir:", cfg.get("paths", "data"))
    print("cache dir:", cfg.get("paths", "cache"))
    print("port:", cfg.get_int("server", "port"))
    print("debug:", cfg.get_bool("server", "debug"))
    print("theme:", cfg.get("server", "theme"))
    print("hosts:", cfg.get_list("server", "hosts"))
    print("log level (inherited):", cfg.get("server", "log_level"))
