"""A policy's weights as training handles them: the dtype they are trained in, activation checkpointing,
the copy an engine serves, and saving a model in the Hugging Face layout with its view settings.
(Opening a policy with its inference engine: rollout/factory.py.)"""

from __future__ import annotations

import torch

from .config import LoraSettings, PolicyConfig


def training_dtype(cfg: PolicyConfig, lora: LoraSettings | None = None) -> str:
    """The dtype a policy is opened in to be trained: float32, whatever `cfg.dtype` says, so that its weights,
    gradients and AdamW state are float32 masters; `cfg.dtype` is then only what it computes in (autocast in
    one process, FSDP2's param_dtype on the ranks). In bf16 an lr-1e-6 step smaller than half a bf16 ulp of
    its weight (any weight above ~2.6e-4 in magnitude) would round away. A LoRA model's frozen base keeps
    `cfg.dtype` (peft holds the adapters, the trained part, in float32)."""
    return cfg.dtype if lora is not None else "float32"


def enable_activation_checkpointing(model) -> None:
    """Recompute every decoder layer and vision block in the backward pass instead of keeping their
    activations (transformers' gradient checkpointing, non-reentrant: it composes with FSDP2 and with
    inputs that need no gradient). Only in training mode: generation and reference passes are unaffected."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # unwrap peft
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def save_model_dir(model, processor, target, view: PolicyConfig | None = None) -> None:
    """HF layout that `from_pretrained` opens; a LoRA model is saved merged. `view` (how the policy
    sees mazes) is saved beside it as mazerl_policy.json."""
    from ..atomic import atomic_directory, write_json

    with atomic_directory(target, overwrite=True) as tmp:
        to_save = model
        if hasattr(model, "merge_and_unload"):
            import copy

            to_save = copy.deepcopy(model).merge_and_unload()
        to_save.save_pretrained(tmp, safe_serialization=True)
        processor.save_pretrained(tmp)
        if view is not None:
            write_json(tmp / PolicyConfig.VIEW_FILE, view.view())


def in_dtype(state: dict, dtype: str) -> dict:
    """A copy of `state` with its floating-point tensors in `dtype` (a PolicyConfig dtype name): what an engine
    or a saved model holds, from a trainer's float32 masters. Integer buffers keep theirs."""
    target = getattr(torch, dtype)
    return {k: v.to(target, copy=True) if v.is_floating_point() else v.clone() for k, v in state.items()}


def serving_weights(state: dict, lora: LoraSettings | None = None) -> dict:
    """A trainer's state dict in the plain Hugging Face keys an engine with its own copy loads.

    A LoRA (peft) model's keys are `base_model.model.<name>`, and each adapted layer holds
    `base_layer.weight`, `lora_A.default.weight`, `lora_B.default.weight`: those become one merged
    weight, W + (alpha / r) B A, exactly what peft's merge_and_unload computes."""
    prefix = "base_model.model."
    if not any(k.startswith(prefix) for k in state):
        return state
    if lora is None:
        raise ValueError("these weights are a LoRA model's (peft keys) but no LoRA settings were given to merge them")
    scale = lora.alpha / lora.r
    plain: dict = {}
    for key, value in state.items():
        name = key[len(prefix):] if key.startswith(prefix) else key
        if ".lora_A." in name or ".lora_B." in name or ".lora_dropout" in name:
            continue
        if ".base_layer." in name:
            module, _, leaf = name.partition(".base_layer.")
            if leaf == "weight":
                a = state[f"{prefix}{module}.lora_A.default.weight"].float()
                b = state[f"{prefix}{module}.lora_B.default.weight"].float()
                value = (value.float() + scale * (b @ a)).to(value.dtype)
            name = f"{module}.{leaf}"
        plain[name] = value
    return plain
