"""Writing a model directory in the Hugging Face layout from a stream of (name, tensor) pairs, so that a
trainer whose weights are sharded (FSDP2) or held as float32 masters can write the consolidated model one
tensor at a time, without opening a second model: safetensors shards of at most `max_shard_bytes` (an
index when there are several, as `save_pretrained` writes them), config.json in the saved dtype, the
generation config, the processor's files and the view (mazerl_policy.json). What `open_policy` and
`from_pretrained` read, like `save_model_dir`'s output."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from ..errors import UserError
from .config import LoraSettings, PolicyConfig

# Bounds the host memory of the writing rank to one shard (save_pretrained's own default is 50 GB).
DEFAULT_MAX_SHARD_BYTES = 5 * 10**9
WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
LORA_PREFIX = "base_model.model."


class ExportError(UserError):
    """A model that cannot be written tensor by tensor as it is (names that save_pretrained would change)."""


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class SafetensorsShardWriter:
    """Tensors in, shards out: each shard is written once it is full, so at most one shard is held in memory.
    Packs in order, a tensor larger than the limit alone in its shard (as huggingface_hub's split does).
    Shards are named model-0000k-of-0000N once N is known (close), or model.safetensors when there is one."""

    def __init__(self, directory: Path, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES):
        if max_shard_bytes < 1:
            raise ValueError(f"max_shard_bytes = {max_shard_bytes}: must be >= 1")
        self.directory, self.max_shard_bytes = Path(directory), max_shard_bytes
        self._pending: dict[str, torch.Tensor] = {}
        self._pending_bytes = 0
        self._written: list[tuple[Path, list[str]]] = []  # (temporary file, its tensor names), in order
        self._names: set[str] = set()
        self.total_bytes = self.total_parameters = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if name in self._names:
            raise ExportError(f"tensor {name!r} given twice")
        self._names.add(name)
        size = _tensor_bytes(tensor)
        if self._pending and self._pending_bytes + size > self.max_shard_bytes:
            self._flush()
        self._pending[name] = tensor.detach().to("cpu").contiguous()
        self._pending_bytes += size
        self.total_bytes += size
        self.total_parameters += tensor.numel()

    def _flush(self) -> None:
        from safetensors.torch import save_file

        path = self.directory / f".shard-{len(self._written):05d}.safetensors"
        save_file(self._pending, str(path), metadata={"format": "pt"})
        self._written.append((path, list(self._pending)))
        self._pending, self._pending_bytes = {}, 0

    def close(self) -> list[Path]:
        """Write the last shard, name the shards and (several) the index; returns the shard files."""
        if self._pending or not self._written:
            self._flush()
        n = len(self._written)
        names = [WEIGHTS_NAME] if n == 1 else [f"model-{k + 1:05d}-of-{n:05d}.safetensors" for k in range(n)]
        files = []
        for (tmp, _), name in zip(self._written, names):
            tmp.replace(self.directory / name)
            files.append(self.directory / name)
        if n > 1:
            from ..atomic import write_json

            weight_map = {t: name for (_, tensors), name in zip(self._written, names) for t in tensors}
            write_json(self.directory / INDEX_NAME, {"metadata": {"total_parameters": self.total_parameters,
                                                                  "total_size": self.total_bytes},
                                                     "weight_map": weight_map})
        return files


def saved_dtype_config(config, dtype: str):
    """A copy of a model's config saying the weights are `dtype`, as save_pretrained writes it for a model in
    that dtype (the trainer's own config says float32: its masters)."""
    config = copy.deepcopy(config)
    config.dtype = dtype
    for key in getattr(config, "sub_configs", {}) or {}:  # a VLM's text and vision configs say it too
        sub = getattr(config, key, None)
        if sub is not None and hasattr(sub, "dtype"):
            sub.dtype = dtype
    return config


def check_saved_as_named(model) -> None:
    """Refuse a model whose checkpoint names differ from its state-dict names (transformers' weight conversions,
    which save_pretrained reverts over the whole state dict): written tensor by tensor they would be wrong."""
    conversions = getattr(model, "_weight_conversions", None)
    if conversions is None:
        try:
            from transformers.conversion_mapping import get_model_conversion_mapping
            from transformers.core_model_loading import PrefixChange
        except ImportError:  # an older transformers: no conversions at all
            return
        conversions = [c for c in get_model_conversion_mapping(model, add_legacy=False) if not isinstance(c, PrefixChange)]
    if conversions:
        raise ExportError(f"{type(model).__name__} renames or converts its weights when saved ({len(conversions)} "
                          "conversions); the tensor-by-tensor export supports models saved under their own names")


def tied_names(model) -> set[str]:
    """State-dict names that are another weight (tied embeddings): save_pretrained leaves them out, and
    from_pretrained ties them again. Empty unless the config ties them."""
    text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if not getattr(text, "tie_word_embeddings", False):
        return set()
    tied = getattr(model, "_tied_weights_keys", None) or {}
    return set(tied) if isinstance(tied, dict) else set(tied)


def merged_lora(named: Iterable[tuple[str, torch.Tensor]], lora: LoraSettings | None) -> Iterator[tuple[str, torch.Tensor]]:
    """A stream of a trainer's weights in the plain keys a served model has: a peft model's adapted layers
    merged (W + alpha / r B A, policy.trainable.serving_weights) as soon as a layer's three parts have come."""
    from .trainable import serving_weights

    parts: dict[str, dict[str, torch.Tensor]] = {}  # an adapted layer -> its pieces seen so far
    for name, value in named:
        if not name.startswith(LORA_PREFIX):
            yield name, value
            continue
        layer = next((name.split(marker)[0] for marker in (".base_layer.weight", ".lora_A.", ".lora_B.")
                      if marker in name), None)
        if layer is None:  # not part of an adapted weight (a bias, a norm, an embedding)
            yield from serving_weights({name: value}, lora).items()
            continue
        group = parts.setdefault(layer, {})
        group[name] = value
        if len(group) == 3:  # base_layer.weight, lora_A, lora_B
            yield from serving_weights(parts.pop(layer), lora).items()
    if parts:
        raise ExportError(f"adapted layers without all of base_layer.weight, lora_A and lora_B: {sorted(parts)[:3]}")


def write_model_dir(tensors: Iterable[tuple[str, torch.Tensor]], model_config, processor, target,
                    view: PolicyConfig | None = None, *, dtype: str, generation_config=None,
                    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> Path:
    """Write `target` (atomically: a reader, or a retry, finds the previous complete directory or the new one)
    from `tensors`, (plain name, tensor) pairs in the saved layout and `dtype`; `model_config` is the model's
    config (written saying `dtype`), `processor` its processor, `view` the policy's view settings."""
    from ..atomic import atomic_directory, write_json

    with atomic_directory(target, overwrite=True) as tmp:
        writer = SafetensorsShardWriter(tmp, max_shard_bytes)
        for name, tensor in tensors:
            writer.add(name, tensor)
        writer.close()
        saved_dtype_config(model_config, dtype).save_pretrained(tmp)
        if generation_config is not None:
            generation_config.save_pretrained(tmp)
        processor.save_pretrained(tmp)
        if view is not None:
            write_json(tmp / PolicyConfig.VIEW_FILE, view.view())
    return Path(target)


def gathered_weights(model, dtype: str, writes: bool = True) -> Iterator[tuple[str, torch.Tensor | None]]:
    """A trainer's weights one tensor at a time, in `dtype` on CPU, tied duplicates left out (as save_pretrained
    does). A model sharded with FSDP2 holds DTensors: each is gathered, a collective, so every rank iterates this
    in the same order; only the rank that `writes` gets the tensors (the others None). On a GPU at most one
    gathered tensor at a time: never a second model."""
    from torch.distributed.tensor import DTensor

    target = getattr(torch, dtype)
    peft = hasattr(model, "get_base_model")
    base = model.get_base_model() if peft else model
    skip = {LORA_PREFIX + n if peft else n for n in tied_names(base)}
    for name, value in model.state_dict().items():
        if name in skip:
            continue
        value = value.detach()
        if value.is_floating_point():
            value = value.to(target)  # the shard first: half the bytes to gather from float32 masters
        if isinstance(value, DTensor):
            value = value.full_tensor()
        yield name, value.to("cpu", copy=True) if writes else None


def save_trained_model(model, processor, target, policy: PolicyConfig, lora: LoraSettings | None = None, *,
                       writes: bool = True, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> None:
    """A trainer's model (sharded with FSDP2 or whole) as a model directory in policy.dtype, LoRA merged, written
    tensor by tensor without a second model. Sharded, a collective: every rank calls it, the one that `writes`
    (rank 0) writes `target`, atomically (a retry replaces it whole)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    check_saved_as_named(base)  # on every rank: all refuse together, none is left waiting in a gather
    weights = gathered_weights(model, policy.dtype, writes)
    if not writes:
        for _ in weights:  # join every gather
            pass
        return
    generation = getattr(base, "generation_config", None) if base.can_generate() else None
    write_model_dir(merged_lora(weights, lora), base.config, processor, target, policy, dtype=policy.dtype,
                    generation_config=generation, max_shard_bytes=max_shard_bytes)


def read_model_tensors(directory) -> dict[str, torch.Tensor]:
    """Every tensor of a model directory (one file or shards with an index): what a test compares."""
    from safetensors.torch import load_file

    directory = Path(directory)
    index = directory / INDEX_NAME
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else [WEIGHTS_NAME]
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(directory / f)))
    return out
