"""Open a Qwen3-VL model and its processor, from a local directory or a hub id.

The tiny CPU model and `Qwen/Qwen3-VL-8B-Instruct` go through the same two calls:
`AutoModelForImageTextToText.from_pretrained` and `AutoProcessor.from_pretrained`. The name
`tiny-base` stands for the pretrained tiny model shipped inside the package (mazerl/assets).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import UserError

DEFAULT_CLUSTER_MODEL = "Qwen/Qwen3-VL-8B-Instruct"
# Named models that ship inside the package (package data): name -> folder under mazerl/assets.
PACKAGED_MODELS = {"tiny-base": "tiny-base"}
PROVENANCE_FILE = "provenance.json"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# The architectures the chat format, the tiny builder and the trainers are written for (config.json's model_type).
SUPPORTED_MODEL_TYPES = {"qwen3_vl": "Qwen3-VL"}
DEVICE_NAME = re.compile(r"^(cpu|cuda(:\d+)?)$")


class PolicyLoadError(UserError, ValueError):
    """A model path or processor that cannot be opened; the message names what is missing."""


@dataclass
class Policy:
    model: torch.nn.Module
    processor: object  # a transformers ProcessorMixin (tokenizer + image processor)
    source: str

    @property
    def tokenizer(self):
        return self.processor.tokenizer  # type: ignore[attr-defined]


def _check_local_dir(path: Path) -> None:
    if not path.is_dir():
        raise PolicyLoadError(f"model directory not found: {path}")
    if not (path / "config.json").exists():
        raise PolicyLoadError(f"{path} has no config.json: not a Hugging Face model directory")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise PolicyLoadError(f"{path} has no weights (*.safetensors or *.bin)")
    if not (path / "processor_config.json").exists() and not (path / "preprocessor_config.json").exists():
        raise PolicyLoadError(
            f"{path} has no processor (processor_config.json / preprocessor_config.json): save the processor "
            "beside the model (processor.save_pretrained) or point at a directory that has one"
        )
    if not (path / "tokenizer.json").exists() and not (path / "tokenizer_config.json").exists():
        raise PolicyLoadError(f"{path} has no tokenizer (tokenizer.json / tokenizer_config.json)")
    check_architecture(path / "config.json")
    for weights in sorted(path.glob("*.safetensors")):
        check_weights_file(weights)


def _supported() -> str:
    return ", ".join(f"{name} (model_type {kind!r})" for kind, name in SUPPORTED_MODEL_TYPES.items())


def check_architecture(config: Path) -> None:
    """A model's config.json names an architecture mazerl can train (SUPPORTED_MODEL_TYPES)."""
    import json

    try:
        data = json.loads(config.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise PolicyLoadError(f"{config} is not UTF-8 text (byte {err.start}): not a model config; supported: {_supported()}") from None
    except ValueError as err:
        raise PolicyLoadError(f"{config} is not valid JSON ({err}); supported: {_supported()}") from None
    kind = data.get("model_type") if isinstance(data, dict) else None
    if kind not in SUPPORTED_MODEL_TYPES:
        found = f"model_type {kind!r}" if isinstance(data, dict) and "model_type" in data else "no model_type"
        raise PolicyLoadError(f"{config} has {found}: mazerl supports {_supported()} models only")


def check_weights_file(path: Path) -> None:
    """A safetensors file whose header and tensors are all there: a truncated or damaged copy is named
    here, not reported as a safetensors error from inside from_pretrained."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt"):
            pass  # opening checks the header and that the tensors it lists cover the whole file
    except (SafetensorError, OSError) as err:
        raise PolicyLoadError(f"{path} is damaged or truncated ({err}); copy the model again") from None


def load_weights_file(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, checked first (check_weights_file)."""
    from safetensors.torch import load_file

    check_weights_file(path)
    return load_file(path)


def check_device_name(device: str) -> str:
    """`device` when it names a device mazerl runs on (cpu, cuda, cuda:N); whether it is here is
    check_device's question, asked when a model is opened (a config may be written for another machine)."""
    if not isinstance(device, str) or not DEVICE_NAME.fullmatch(device):
        raise ValueError(f"{device!r} is not a device: allowed cpu, cuda, cuda:N (N = 0, 1, ...)")
    return device


def check_device(device: str) -> None:
    """A device that is here: asking for a GPU on a machine without one is an error before any work."""
    try:
        kind = torch.device(check_device_name(device))
    except ValueError as err:
        raise PolicyLoadError(f"policy.device {err}") from None
    if kind.type == "cuda":
        if not torch.cuda.is_available():
            raise PolicyLoadError(f"policy.device {device!r}: no CUDA device here; use cpu (policy.device=cpu)")
        if kind.index is not None and kind.index >= torch.cuda.device_count():
            raise PolicyLoadError(f"policy.device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s) "
                                  f"(cuda:0..cuda:{torch.cuda.device_count() - 1})")


def _assets_dir() -> Path:
    from importlib.resources import files

    return Path(str(files("mazerl") / "assets"))


def packaged_model_dir(name: str) -> Path:
    """The directory of a model shipped with the package: exactly the files its provenance.json lists,
    each with its sha256 (integrity.py)."""
    from ..integrity import ManifestError, verify_folder

    path = _assets_dir() / PACKAGED_MODELS[name]
    provenance = path / PROVENANCE_FILE
    if not provenance.exists():
        raise PolicyLoadError(
            f"this build of mazerl has no {name!r} model ({path} is missing or incomplete): rebuild it with "
            f"`make tiny-base` (mazerl policy pretrain-tiny), or name another model"
        )
    try:
        verify_folder(path, PROVENANCE_FILE)
    except ManifestError as err:
        raise PolicyLoadError(f"{name!r} is damaged: {err}; reinstall mazerl or rebuild it with `make tiny-base`") from None
    return path


def model_cache_dir() -> Path:
    """Where models named by an s3:// address are downloaded to: $MAZERL_MODEL_CACHE, else
    ~/.cache/mazerl/models."""
    import os

    return Path(os.environ.get("MAZERL_MODEL_CACHE") or Path.home() / ".cache" / "mazerl" / "models")


def fetch_s3_model(uri: str) -> Path:
    """A model uploaded with its manifest (a promoted model, s3://.../models/<run>) as a local
    directory: downloaded once per machine (every file checked against the manifest, the folder
    appearing complete or not at all), then reused. Each pod that loads it fetches it itself, so an
    address, never a pod-local path, is what passes between pipeline steps."""
    import hashlib

    from ..storage import get_tree

    target = model_cache_dir() / hashlib.sha256(uri.rstrip("/").encode()).hexdigest()[:20]
    if not (target / "config.json").is_file():
        get_tree(uri, target)
    return target


def resolve_model_name(path_or_id: str | Path) -> str:
    """A packaged model's name (`tiny-base`) -> its verified directory; an s3:// address -> its local
    copy (fetch_s3_model); anything else (a path or hub id) unchanged."""
    name = str(path_or_id)
    if name.startswith("s3://"):
        return str(fetch_s3_model(name))
    return str(packaged_model_dir(name)) if name in PACKAGED_MODELS else name


def looks_like_local_path(path_or_id: str) -> bool:
    return path_or_id.startswith((".", "/", "~")) or Path(path_or_id).exists() or path_or_id.count("/") != 1


def load_policy(path_or_id: str | Path, dtype: str = "float32", device: str = "cpu", processor_path: str | Path | None = None) -> Policy:
    """Load model + processor. A local path is checked first so a missing file gets a clear error."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    if dtype not in DTYPES:
        raise PolicyLoadError(f"unknown dtype {dtype!r}: allowed {', '.join(DTYPES)}")
    check_device(device)
    source = resolve_model_name(path_or_id)
    if looks_like_local_path(source):
        _check_local_dir(Path(source).expanduser())
    processor = AutoProcessor.from_pretrained(str(processor_path or source))
    model = AutoModelForImageTextToText.from_pretrained(source, dtype=DTYPES[dtype]).to(device)
    # Batched generation needs left padding; training code pads explicitly.
    processor.tokenizer.padding_side = "left"
    return Policy(model=model, processor=processor, source=source)
