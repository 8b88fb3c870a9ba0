"""Open any Qwen-VL-family model and its processor, from a local directory or a hub id.

The tiny CPU model and `Qwen/Qwen3-VL-8B-Instruct` go through the same two calls:
`AutoModelForImageTextToText.from_pretrained` and `AutoProcessor.from_pretrained`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

DEFAULT_CLUSTER_MODEL = "Qwen/Qwen3-VL-8B-Instruct"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class PolicyLoadError(ValueError):
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


def looks_like_local_path(path_or_id: str) -> bool:
    return path_or_id.startswith((".", "/", "~")) or Path(path_or_id).exists() or path_or_id.count("/") != 1


def load_policy(path_or_id: str | Path, dtype: str = "float32", device: str = "cpu", processor_path: str | Path | None = None) -> Policy:
    """Load model + processor. A local path is checked first so a missing file gets a clear error."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    if dtype not in DTYPES:
        raise PolicyLoadError(f"unknown dtype {dtype!r}: allowed {', '.join(DTYPES)}")
    source = str(path_or_id)
    if looks_like_local_path(source):
        _check_local_dir(Path(source).expanduser())
    processor = AutoProcessor.from_pretrained(str(processor_path or source))
    model = AutoModelForImageTextToText.from_pretrained(source, dtype=DTYPES[dtype]).to(device)
    # Batched generation needs left padding; training code pads explicitly.
    processor.tokenizer.padding_side = "left"
    return Policy(model=model, processor=processor, source=source)
