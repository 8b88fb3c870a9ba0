"""The one place an inference engine is chosen for a policy config."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..policy.chat import ChatFormat
from .engine import HFEngine, InferenceEngine

if TYPE_CHECKING:
    from ..policy.config import PolicyConfig


def make_engine(cfg: PolicyConfig, model, chat: ChatFormat) -> InferenceEngine:
    """The engine `cfg.engine` names, serving `model` (the in-process HF engine shares its weights)."""
    if cfg.engine == "hf":
        return HFEngine.from_chat(model, chat, max_batch=cfg.max_batch)
    raise ValueError(f"unknown engine {cfg.engine!r}: allowed hf")
