"""Load a job's YAML config into its pydantic model; errors name the field and what is allowed."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

T = TypeVar("T", bound=BaseModel)


class ConfigError(ValueError):
    """A config file that is missing, unreadable or invalid."""


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
        if not path.exists():
            raise ConfigError(f"config file not found: {path}")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{path} is not valid YAML: {err}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must hold a mapping of settings, got {type(data).__name__}")
    for key, value in (overrides or {}).items():
        node = data
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
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
        out[k.strip()] = yaml.safe_load(v)
    return out
