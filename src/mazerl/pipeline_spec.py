"""Reading a compiled pipeline package (the IR YAML `mazerl pipeline compile` writes): its name,
its parameters and their types, and a digest that names its content."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml

from .config import ConfigError


def _spec(package: str | Path) -> dict:
    return next(yaml.safe_load_all(Path(package).read_text()))


def pipeline_parameters(package: str | Path) -> dict[str, str]:
    """Name -> KFP parameter type (STRING, NUMBER_INTEGER, NUMBER_DOUBLE, BOOLEAN, ...)."""
    params = _spec(package).get("root", {}).get("inputDefinitions", {}).get("parameters", {})
    return {name: p["parameterType"] for name, p in params.items()}


def check_parameters(package: str | Path, params: dict[str, Any]) -> dict[str, Any]:
    """Reject names the pipeline does not take and values of the wrong kind, before a run starts;
    integers given for a float parameter become floats."""
    kinds = pipeline_parameters(package)
    unknown = sorted(set(params) - set(kinds))
    if unknown:
        raise ConfigError(f"unknown pipeline parameter(s) {', '.join(unknown)}: allowed {', '.join(sorted(kinds))}")
    checked = {}
    for name, value in params.items():
        kind = kinds[name]
        ok = {
            "STRING": isinstance(value, str),
            "NUMBER_INTEGER": isinstance(value, int) and not isinstance(value, bool),
            "NUMBER_DOUBLE": isinstance(value, (int, float)) and not isinstance(value, bool),
            "BOOLEAN": isinstance(value, bool),
        }.get(kind, True)
        if not ok:
            wanted = {"STRING": "a string", "NUMBER_INTEGER": "an integer", "NUMBER_DOUBLE": "a number", "BOOLEAN": "true or false"}[kind]
            raise ConfigError(f"pipeline parameter {name} = {value!r} is not {wanted}")
        checked[name] = float(value) if kind == "NUMBER_DOUBLE" else value
    return checked


def package_digest(package: str | Path) -> str:
    return hashlib.sha256(Path(package).read_bytes()).hexdigest()


def pipeline_name(package: str | Path) -> str:
    return _spec(package)["pipelineInfo"]["name"]
