"""Checkpoints that are complete or invisible, and `latest` that only ever names a complete one.

Layout of `ROOT/step-00000010/`:
  model/                 HF layout (safetensors + config + processor): `from_pretrained` opens it
  trainer_state.pt       optimizer + scheduler state and torch RNG (tensors and plain types only,
                         loaded with weights_only=True)
  state.json             step, config, data sampler position, python/numpy RNG states, seeds
  manifest.json          sha256 of every file above; written last (integrity.py: it must list exactly
                         the checkpoint's files)
A checkpoint is built in a temporary directory and renamed into place; `ROOT/latest` then names it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch

from ..atomic import atomic_directory, write_json, write_text
from ..errors import UserError
from ..integrity import MANIFEST, manifest_of, sha256_file, verify  # noqa: F401 (sha256_file re-exported)

log = logging.getLogger(__name__)
_STEP_DIR = re.compile(r"step-([0-9]{8})")


# Rust's std::io errors (safetensors) end in "(os error N)"; torch's own file writer loses the errno.
_RUST_OS_ERROR = re.compile(r"os error (\d+)")
_TORCH_WRITE_FAILED = "file write failed"


@contextlib.contextmanager
def _writing(target: Path) -> Iterator[None]:
    """A failure to write checkpoint `target` as an OSError naming it (not the temporary file it happened
    in), so the command line reports a full disk as "cannot use TARGET: no space left on the device"
    (bad input), not as an internal error."""
    from safetensors import SafetensorError

    try:
        yield
    except OSError as err:
        if err.errno is None:
            raise
        raise OSError(err.errno, err.strerror or str(err), str(target)) from None
    except (RuntimeError, SafetensorError) as err:
        found = _RUST_OS_ERROR.search(str(err))
        if found:
            raise OSError(int(found.group(1)), str(err), str(target)) from None
        if _TORCH_WRITE_FAILED in str(err) and shutil.disk_usage(target.parent).free == 0:
            raise OSError(errno.ENOSPC, str(err), str(target)) from None
        raise


class CheckpointManager:
    def __init__(self, root: str | Path, keep_last: int = 3):
        if keep_last < 1:
            raise ValueError(f"keep_last = {keep_last}: must be >= 1")
        self.root = Path(root)
        self.keep_last = keep_last

    def step_dirs(self) -> list[tuple[int, Path]]:
        if not self.root.is_dir():
            return []
        out = []
        for p in self.root.iterdir():
            m = _STEP_DIR.fullmatch(p.name)
            if m and p.is_dir():
                out.append((int(m.group(1)), p))
        return sorted(out)

    def save(self, step: int, model, processor, trainer_state: dict, state: dict, view: dict | None = None) -> Path:
        target = self.root / f"step-{step:08d}"
        with _writing(target), atomic_directory(target, overwrite=True) as tmp:
            model.save_pretrained(tmp / "model", safe_serialization=True)
            processor.save_pretrained(tmp / "model")
            if view is not None:
                write_json(tmp / "model" / "mazerl_policy.json", view)
            torch.save(trainer_state, tmp / "trainer_state.pt")
            write_json(tmp / "state.json", state)
            write_json(tmp / MANIFEST, {"step": step, "files": manifest_of(tmp, MANIFEST)})
        write_text(self.root / "latest", target.name + "\n")
        self.prune()
        return target

    # Paths the run reads (its data, base model, the checkpoint it resumed from): never pruned.
    inputs: tuple[Path, ...] = ()

    def prune(self, keep: tuple[str | Path, ...] | list[str | Path] | None = None) -> None:
        """Keep the newest `keep_last` checkpoints, and every older one that holds one of `keep`
        (default: `self.inputs`): pruning never deletes an input of the run."""
        from ..atomic import inside

        protected = self.inputs if keep is None else tuple(keep)
        dirs = self.step_dirs()
        for _, p in dirs[: max(0, len(dirs) - self.keep_last)]:
            if any(inside(path, p) for path in protected):
                continue
            shutil.rmtree(p, ignore_errors=True)

    def latest(self) -> Path | None:
        """The newest complete checkpoint; damaged or partial ones are skipped with a warning."""
        for step, p in reversed(self.step_dirs()):
            problem = verify(p)
            if problem is None:
                return p
            log.warning("skipping checkpoint %s: %s", p, problem)
        return None


def load_trainer_state(path: Path) -> tuple[dict, dict]:
    """(trainer_state, state) of a checkpoint. Nothing is unpickled: weights_only=True."""
    trainer_state = torch.load(path / "trainer_state.pt", weights_only=True, map_location="cpu")
    state = json.loads((path / "state.json").read_text())
    return trainer_state, state


class CheckpointMismatchError(UserError, ValueError):
    """A checkpoint whose weights do not belong to the model being trained."""


def is_lora(model) -> bool:
    return hasattr(model, "peft_config")


def load_model_weights(model, path: Path) -> None:
    """Copy a checkpoint's safetensors weights into `model` in place (strict: every key must match).
    A LoRA model's checkpoint holds its adapters only, saved and loaded with peft's own functions.
    A truncated or damaged weights file is a PolicyLoadError naming it."""
    from ..policy.loading import load_weights_file

    if is_lora(model):
        from peft import set_peft_model_state_dict

        adapter = path / "model" / "adapter_model.safetensors"
        if not adapter.is_file():
            raise CheckpointMismatchError(f"checkpoint {path} holds no LoRA adapters (adapter_model.safetensors): it is not from a LoRA run")
        try:
            result = set_peft_model_state_dict(model, load_weights_file(adapter))
        except RuntimeError as err:  # torch's size-mismatch report: adapters of another model or rank
            raise CheckpointMismatchError(f"checkpoint {path} does not fit the LoRA model: {str(err).splitlines()[-1].strip()}") from None
        if result.unexpected_keys:
            raise CheckpointMismatchError(f"checkpoint {path} does not fit the LoRA model: unexpected {result.unexpected_keys[:5]}")
        return
    weights: dict[str, torch.Tensor] = {}
    for f in sorted((path / "model").glob("*.safetensors")):
        weights.update(load_weights_file(f))
    own = model.state_dict()
    wrong_shape = [f"{k} {tuple(v.shape)} (model: {tuple(own[k].shape)})" for k, v in weights.items()
                   if k in own and own[k].shape != v.shape]
    if wrong_shape:
        raise CheckpointMismatchError(f"checkpoint {path} is from another model (shapes differ): {', '.join(wrong_shape[:3])}")
    missing, unexpected = model.load_state_dict(weights, strict=False)
    # Tied or non-persistent buffers may be absent from the file; anything else is a real mismatch.
    real_missing = [k for k in missing if not k.endswith("inv_freq")]
    if real_missing or unexpected:
        raise CheckpointMismatchError(f"checkpoint {path} does not fit the model (another model or a LoRA run?): missing {real_missing[:5]}, unexpected {unexpected[:5]}")
