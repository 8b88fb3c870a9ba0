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
    if cfg.engine == "vllm":
        from .vllm_engine import VLLMEngine

        if cfg.vllm.max_model_len is None or cfg.vllm.max_images_per_prompt is None:
            from ..cluster.plan import default_prompt_limits  # the trainers resolve them from their split first

            cfg = default_prompt_limits(cfg, chat.image_tokens)
        v = cfg.vllm
        return VLLMEngine(cfg.model, chat, dtype=cfg.dtype, max_model_len=v.max_model_len,
                          max_images_per_prompt=v.max_images_per_prompt,
                          # unset here: nothing resolved it for a training rank beside it (the trainers do first)
                          gpu_memory_utilization=v.gpu_memory_utilization or v.SOLE_GPU_SHARE,
                          enable_sleep_mode=v.enable_sleep_mode)
    raise ValueError(f"unknown engine {cfg.engine!r}: allowed hf, vllm")


def check_engine_available(cfg: PolicyConfig) -> None:
    """Before any work starts: the engine the config names can run in this Python."""
    if cfg.engine == "vllm":
        from .vllm_engine import require_vllm

        require_vllm()
