"""Load a job's YAML config into its pydantic model; errors name the field and what is allowed."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from .errors import UserError

T = TypeVar("T", bound=BaseModel)


class ConfigError(UserError, ValueError):
    """A config file that is missing, unreadable or invalid."""


MAX_TEXT_FILE_BYTES = 16 * 2**20  # configs, fixtures, tokens: far below this; a larger file is a mistake


def read_text_file(path: str | Path, what: str) -> str:
    """The UTF-8 text of `path`, or a ConfigError naming `what` it is and what is wrong. Reads through
    open(), so named pipes and process substitution (/dev/fd/N) work."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_TEXT_FILE_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{what} not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {path} is a directory; a file is expected") from None
    except OSError as err:
        raise ConfigError(f"cannot read {what} {path}: {err.strerror or err}") from None
    if len(data) > MAX_TEXT_FILE_BYTES:
        raise ConfigError(f"{what} {path} is larger than {MAX_TEXT_FILE_BYTES // 2**20} MiB; is it the right file?")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{what} {path} is not UTF-8 text (byte {err.start}: {data[err.start:err.start + 1]!r}); "
                          "save it as UTF-8") from None


def load_yaml_file(path: str | Path, what: str):
    """Parsed YAML of `path`; a syntax error names the file, line and column."""
    text = read_text_file(path, what)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{what} {path} is not valid YAML:{where}: {problem}") from None


def format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid config {source}:"]
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "(top level)"
        lines.append(f"  {field}: {e['msg']}")
    return "\n".join(lines)


def load_config(cls: type[T], path: str | Path | None = None, overrides: dict | None = None) -> T:
    """`cls` from a YAML file (optional) with `overrides` (dotted keys allowed) applied on top."""
    data: dict = {}
    source = "(defaults)"
    if path is not None:
        from .profiles import resolve_job_config

        path = Path(resolve_job_config(str(path)))
        source = str(path)
        data = load_yaml_file(path, "config file") or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must hold a mapping of settings, got {type(data).__name__}")
    for key, value in (overrides or {}).items():
        node = data
        parts = key.split(".")
        if not all(parts):
            raise ConfigError(f"setting {key!r}: empty name between dots")
        for depth, p in enumerate(parts[:-1]):
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                section = ".".join(parts[: depth + 1])
                raise ConfigError(f"cannot set {key!r}: {section!r} is a value ({node!r}), not a section with settings")
        node[parts[-1]] = value
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None


def parse_overrides(items: list[str]) -> dict:
    """`key=value` strings (value parsed as YAML) into a dict."""
    out = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value (e.g. steps=20, optim.lr=1e-5)")
        k, v = item.split("=", 1)
        try:
            out[k.strip()] = yaml.safe_load(v)
        except yaml.YAMLError as err:
            raise ConfigError(f"override {item!r}: the value is not valid YAML ({str(err).splitlines()[0]})") from None
    return out
