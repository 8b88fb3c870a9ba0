"""Load a job's YAML config into its pydantic model; errors name the field and what is allowed."""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path
from typing import Annotated, Literal, TypeVar

import yaml
from pydantic import AfterValidator, BaseModel, Field, ValidationError

from .errors import UserError, format_validation_error, shorten  # noqa: F401 (format_validation_error: config's readers use it from here)

T = TypeVar("T", bound=BaseModel)


class ConfigError(UserError, ValueError):
    """A config file that is missing, unreadable or invalid."""


MAX_TEXT_FILE_BYTES = 16 * 2**20  # configs, fixtures, tokens: far below this; a larger file is a mistake
MAX_CONFIG_FILE_BYTES = 2**20  # a YAML file of settings (job config, dataset config, profile): the shipped ones are a few KB


def read_text_file(path: str | Path, what: str, max_bytes: int = MAX_TEXT_FILE_BYTES) -> str:
    """The UTF-8 text of `path`, or a ConfigError naming `what` it is and what is wrong. Reads through
    open(), so named pipes and process substitution (/dev/fd/N) work."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except FileNotFoundError:
        raise ConfigError(f"{what} not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {path} is a directory; a file is expected") from None
    except OSError as err:
        raise ConfigError(f"cannot read {what} {path}: {err.strerror or err}") from None
    if len(data) > max_bytes:
        raise ConfigError(f"{what} {path} is larger than {max_bytes // 2**20} MiB; is it the right file?")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{what} {path} is not UTF-8 text (byte {err.start}: {data[err.start:err.start + 1]!r}); "
                          "save it as UTF-8") from None


class YAMLAliasError(yaml.composer.ComposerError):
    """A YAML anchor (&name) or alias (*name) in settings."""


class ConfigLoader(yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader):
    """The one YAML reader for settings a user gives (job configs, dataset configs, profiles, the
    values of `--set`/`--param`); use it through `parse_yaml`, which also refuses anchors and aliases
    before anything is built (nested aliases let a few hundred bytes expand to gigabytes, and no
    setting needs them). Unlike PyYAML's SafeLoader (YAML 1.1), plain scalars resolve as in YAML 1.2's
    core schema: only true/false are booleans, so `autocast: off` or `name: no` stay words; integers
    are decimal, 0o octal or 0x hex, so `seed: 010` is 10 (not octal 8) and `1:30` is not base-60 90;
    dates stay text. A float needs a dot, as in PyYAML (`1e-5` stays text, which a float setting
    reads as 1e-5, and `model: 1e3` stays a name). libyaml's parser when it is installed: fast."""


def _construct_int(loader: ConfigLoader, node) -> int:
    text = loader.construct_scalar(node)
    try:
        return int(text, 0) if text[:2].lower() in ("0o", "0x") else int(text, 10)
    except ValueError:
        raise yaml.constructor.ConstructorError(None, None, f"{text!r} is not an integer", node.start_mark) from None


_YAML11_ONLY = {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
                "tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:value"}
ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in _YAML11_ONLY]
    for first, resolvers in ConfigLoader.yaml_implicit_resolvers.items()
}
ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                   list("tTfF"))
ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
                                   list("-+0123456789"))
ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?"
               r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))
ConfigLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def parse_yaml(text: str, what: str):
    """`text` read with ConfigLoader; a syntax error, an anchor or an alias names `what`, the line and
    column. Anchors and aliases are looked for in the parser's events (a pass that builds nothing)
    before the document is built."""
    try:
        for event in yaml.parse(text, Loader=ConfigLoader):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
                raise YAMLAliasError(None, None, "YAML anchors (&name) and aliases (*name) are not allowed in "
                                     "settings: write each value out", event.start_mark)
        return yaml.load(text, Loader=ConfigLoader)  # noqa: S506 - a safe loader
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark is not None else ""
        problem = shorten(getattr(err, "problem", None) or str(err).splitlines()[0])
        if isinstance(err, YAMLAliasError):
            raise ConfigError(f"{what}:{where} {problem}") from None
        raise ConfigError(f"{what} is not valid YAML:{where} {problem}") from None


def load_yaml_file(path: str | Path, what: str):
    """Parsed YAML of `path` (at most MAX_CONFIG_FILE_BYTES, read with ConfigLoader); a syntax error
    names the file, line and column."""
    return parse_yaml(read_text_file(path, what, MAX_CONFIG_FILE_BYTES), f"{what} {path}")


# ---- kinds of numbers, each checked the same way wherever it is read

MAX_SEED = 2**63 - 1  # Python's, numpy's and torch's generators all take 0..2**63-1 (torch: no more than 2**64-1)


def check_seed(value: int, what: str = "seed") -> int:
    """`value` if it can seed every generator (and fits an int64 column); else a ConfigError naming `what`."""
    if not 0 <= value <= MAX_SEED:
        raise ConfigError(f"{what} {shorten(str(value), 40)} is out of range: a seed is a whole number from 0 to "
                          f"{MAX_SEED} (2**63 - 1)")
    return value


# A sampling temperature divides float32 logits: below MIN_TEMPERATURE (1e-300 is 0 in float32) the
# division overflows to inf and NaN, and vLLM samples greedily anyway (its cut-off is 1e-5); above
# MAX_TEMPERATURE the distribution is already uniform, and past float32's range masked -inf logits
# turn into NaN. Greedy decoding is temperature 0, where a setting allows it.
MIN_TEMPERATURE = 1e-5
MAX_TEMPERATURE = 100.0


def check_temperature(value: float, greedy_allowed: bool = False) -> float:
    """`value` if float32 sampling can use it (0 too where `greedy_allowed`); else a ConfigError saying the range."""
    if greedy_allowed and value == 0.0:
        return value
    if not MIN_TEMPERATURE <= value <= MAX_TEMPERATURE:
        allowed = f"{'0 (greedy) or ' if greedy_allowed else ''}{MIN_TEMPERATURE:g} to {MAX_TEMPERATURE:g}"
        raise ConfigError(f"temperature {value:g} is out of range: allowed {allowed} (outside it, sampling's "
                          "float32 arithmetic overflows)")
    return value


# The largest turn budget a setting may give. The largest maze (63x63 cells, mazes.layout.MAX_CELLS)
# has routes of up to 2 x (63 x 63 - 1) = 7,936 moves, and the default budget is twice the optimal
# route: 15,872. A larger budget only lets an episode that never stops run (and grow its prompt) longer.
MAX_TURN_BUDGET = 16_384

Seed = Annotated[int, AfterValidator(check_seed)]
Temperature = Annotated[float, AfterValidator(check_temperature)]
TemperatureOrGreedy = Annotated[float, AfterValidator(lambda value: check_temperature(value, greedy_allowed=True))]
TurnBudget = Annotated[int, Field(ge=1, le=MAX_TURN_BUDGET)]


# ---- `--set key=TEXT`: TEXT read by the type of the setting it names

_NULL_WORDS = ("", "~", "null", "Null", "NULL")


def _members(annotation) -> tuple:
    """The alternatives of a union (`X | None`, Optional[X], Union[...]); (annotation,) otherwise;
    each without its Annotated[...] constraints."""
    if typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    members = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else (annotation,)
    return tuple(typing.get_args(m)[0] if typing.get_origin(m) is Annotated else m for m in members)


def _takes_text(annotation) -> bool:
    """Whether a setting of this type is text: str, a path, or a Literal of words (alone or in a union)."""
    for member in _members(annotation):
        if typing.get_origin(member) is Literal and any(isinstance(v, str) for v in typing.get_args(member)):
            return True
        if isinstance(member, type) and issubclass(member, (str, Path)):
            return True
    return False


def setting_type(model: type[BaseModel], key: str):
    """The type of the setting a dotted `key` names in `model` (through nested, optional and dict
    sections), or None where `model` has no such setting."""
    annotation = model
    for part in key.split("."):
        sections = [m for m in _members(annotation) if isinstance(m, type) and issubclass(m, BaseModel)]
        mappings = [m for m in _members(annotation) if typing.get_origin(m) is dict]
        if sections:
            field = sections[0].model_fields.get(part)
            if field is None:
                return None
            annotation = field.annotation
        elif mappings and len(typing.get_args(mappings[0])) == 2:
            annotation = typing.get_args(mappings[0])[1]
        else:
            return None
    return annotation


def read_setting_text(text: str, annotation, what: str):
    """The value of a setting typed as `text` on the command line, read by the setting's type
    `annotation`: a text setting (str, a path, a Literal of words) gets `text` exactly as typed, so
    `off`, `007`, `1e3` and `null` stay words (an optional one gets None for YAML's null words: empty,
    ~, null); any other setting, or an unknown one (None), gets `text` read as YAML (ConfigLoader):
    numbers, true/false, null, [lists], {mappings}."""
    if annotation is not None and _takes_text(annotation):
        if type(None) in _members(annotation) and text.strip() in _NULL_WORDS:
            return None
        return text
    return parse_yaml(text, what)


JOB_CONFIG_DIR = Path(__file__).resolve().parent / "configs" / "jobs"  # the shipped job configs, by name


def resolve_job_config(name_or_path: str) -> str:
    """A job config by name (`tiny-grpo`: mazerl/configs/jobs/tiny-grpo.yaml) or by path."""
    path = Path(name_or_path)
    if path.exists() or path.suffix in (".yaml", ".yml") or "/" in name_or_path:
        return str(path)
    shipped = JOB_CONFIG_DIR / f"{name_or_path}.yaml"
    if shipped.exists():
        return str(shipped)
    names = ", ".join(sorted(p.stem for p in JOB_CONFIG_DIR.glob("*.yaml")))
    raise ConfigError(f"unknown config {name_or_path!r}: give a YAML file or one of the shipped configs ({names})")


EXTENDS_KEY = "extends"


def merged_settings(base: dict, changes: dict) -> dict:
    """`base` with `changes` on top: sections (mappings) merge key by key, any other value replaces."""
    out = dict(base)
    for key, value in changes.items():
        out[key] = merged_settings(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load_job_settings(name_or_path: str | Path, _chain: tuple[Path, ...] = ()) -> dict:
    """The settings of a job config, with those of the config it `extends:` underneath, recursively.
    `extends` names a shipped config (`tiny-grpo`) or a YAML path, relative to the extending file's
    folder: a variant of a recipe states only what it changes, and a change to the recipe reaches it."""
    text = str(name_or_path)
    if _chain and not Path(text).is_absolute() and ("/" in text or Path(text).suffix in (".yaml", ".yml")):
        text = str(_chain[-1].parent / text)
    path = Path(resolve_job_config(text)).resolve()
    if path in _chain:
        cycle = " -> ".join(str(p) for p in (*_chain[_chain.index(path):], path))
        raise ConfigError(f"config {_chain[-1]}: extends makes a cycle ({cycle}); a config cannot extend itself")
    data = load_yaml_file(path, "config file") or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of settings, got {type(data).__name__}")
    parent = data.pop(EXTENDS_KEY, None)
    if parent is None:
        return data
    if not isinstance(parent, str) or not parent.strip():
        raise ConfigError(f"{path}: {EXTENDS_KEY}: {shorten(repr(parent), 60)} is not a config name; give a shipped "
                          "config's name (e.g. tiny-grpo) or the path of a YAML file")
    return merged_settings(load_job_settings(parent.strip(), (*_chain, path)), data)


def load_config(cls: type[T], path: str | Path | None = None, overrides: dict | None = None) -> T:
    """`cls` from a YAML file (optional, with what it `extends:`) with `overrides` (dotted keys allowed)
    applied on top."""
    data: dict = {}
    source = "(defaults)"
    if path is not None:
        path = Path(resolve_job_config(str(path)))
        source = str(path)
        data = load_job_settings(path)
    for key, value in (overrides or {}).items():
        node = data
        parts = key.split(".")
        if not all(parts):
            raise ConfigError(f"setting {shorten(key)!r}: empty name between dots")
        for depth, p in enumerate(parts[:-1]):
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                section = ".".join(parts[: depth + 1])
                raise ConfigError(f"cannot set {shorten(key)!r}: {section!r} is a value ({shorten(repr(node), 60)}), "
                                  "not a section with settings")
        if isinstance(value, str):  # text from the command line (parse_overrides), or a caller's string
            value = read_setting_text(value, setting_type(cls, key), f"setting {shorten(key)!r}")
        node[parts[-1]] = value
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None


def parse_overrides(items: list[str]) -> dict[str, str]:
    """`key=value` strings into {key: value's text, exactly as typed}. The text is read by the type of
    the setting it names where it is applied (load_config, pipeline_spec.check_parameters), so
    `--set autocast=off` stays the word off and `--set run_name=007` the name 007; rendered back as
    `key=value` (a RayJob's `--set`), it means the same there."""
    out = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {shorten(item)!r} must look like key=value (e.g. steps=20, optim.lr=1e-5)")
        k, v = item.split("=", 1)
        out[k.strip()] = v
    return out
