"""Reading a compiled pipeline package (the IR YAML `mazerl pipeline compile` writes): its name,
its parameters and their types, and a digest that names its content."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

import yaml

from .config import ConfigError, read_setting_text, shorten


def _spec(package: str | Path) -> dict:
    return next(yaml.safe_load_all(Path(package).read_text()))


def pipeline_parameters(package: str | Path) -> dict[str, str]:
    """Name -> KFP parameter type (STRING, NUMBER_INTEGER, NUMBER_DOUBLE, BOOLEAN, ...)."""
    params = _spec(package).get("root", {}).get("inputDefinitions", {}).get("parameters", {})
    return {name: p["parameterType"] for name, p in params.items()}


# The Python type a KFP parameter type holds: how `--param name=TEXT` is read (config.read_setting_text)
_PARAMETER_TYPES = {"STRING": str, "NUMBER_INTEGER": int, "NUMBER_DOUBLE": float, "BOOLEAN": bool}
_INT64 = (-(2**63), 2**63 - 1)  # KFP sends integers as protobuf int64


def pipeline_defaults(package: str | Path) -> dict[str, Any]:
    """Name -> default value, for the parameters that have one."""
    params = _spec(package).get("root", {}).get("inputDefinitions", {}).get("parameters", {})
    return {name: p["defaultValue"] for name, p in params.items() if "defaultValue" in p}


def check_parameters(package: str | Path, params: dict[str, Any]) -> dict[str, Any]:
    """Reject names the pipeline does not take and values of the wrong kind, before a run starts.
    Text (`--param name=TEXT`) is read by the parameter's type: a STRING parameter keeps it exactly as
    typed (`model=007` stays 007), others read it as YAML; integers given for a float parameter become floats."""
    kinds = pipeline_parameters(package)
    unknown = sorted(set(params) - set(kinds))
    if unknown:
        raise ConfigError(f"unknown pipeline parameter(s) {shorten(', '.join(unknown))}: allowed {', '.join(sorted(kinds))}")
    checked = {}
    for name, value in params.items():
        kind = kinds[name]
        if isinstance(value, str):
            value = read_setting_text(value, _PARAMETER_TYPES.get(kind), f"pipeline parameter {name}")
        ok = {
            "STRING": isinstance(value, str),
            "NUMBER_INTEGER": isinstance(value, int) and not isinstance(value, bool),
            "NUMBER_DOUBLE": isinstance(value, (int, float)) and not isinstance(value, bool),
            "BOOLEAN": isinstance(value, bool),
        }.get(kind, True)
        if not ok:
            wanted = {"STRING": "a string", "NUMBER_INTEGER": "an integer", "NUMBER_DOUBLE": "a number", "BOOLEAN": "true or false"}[kind]
            raise ConfigError(f"pipeline parameter {name} = {shorten(repr(value), 60)} is not {wanted}")
        if kind == "NUMBER_INTEGER" and not _INT64[0] <= value <= _INT64[1]:
            raise ConfigError(f"pipeline parameter {name} = {shorten(str(value), 40)} is out of range for an integer "
                              f"parameter: allowed {_INT64[0]} to {_INT64[1]}")
        if kind == "NUMBER_DOUBLE" and not math.isfinite(value):
            raise ConfigError(f"pipeline parameter {name} = {value} is not a finite number")
        checked[name] = float(value) if kind == "NUMBER_DOUBLE" else value
    return checked


def package_digest(package: str | Path) -> str:
    return hashlib.sha256(Path(package).read_bytes()).hexdigest()


def pipeline_name(package: str | Path) -> str:
    return _spec(package)["pipelineInfo"]["name"]
