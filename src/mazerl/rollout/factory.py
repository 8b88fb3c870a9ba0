"""The one place an inference engine is chosen for a policy config, and a policy opened with it (model, chat
format, engine, reply grammar) for training or evaluation."""

from __future__ import annotations

from dataclasses import dataclass

from ..policy.chat import ChatFormat
from ..policy.config import LoraSettings, PolicyConfig
from ..policy.grammar import ActionGrammar
from ..policy.loading import Policy, load_policy
from ..policy.prompts import PROMPTS
from ..policy.sampling import SamplingParams
from ..policy.trainable import enable_activation_checkpointing, training_dtype
from .engine import HFEngine, InferenceEngine


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


@dataclass
class TrainablePolicy:
    policy: Policy
    chat: ChatFormat
    engine: InferenceEngine | None  # None when opened for training only (a Ray training rank)
    config: PolicyConfig
    reply_choices: tuple[int, ...] | None = None  # the action grammar's word ids (None: free replies)

    def sampling(self, temperature: float = 0.0, seed: int = 0, top_p: float = 1.0) -> SamplingParams:
        """Sampling settings for this policy, banned tokens included: what every engine call and the
        trainer's log-probabilities use."""
        return self.config.sampling(temperature=temperature, seed=seed, top_p=top_p,
                                    banned_ids=tuple(self.chat.banned_reply_ids))


def open_policy(cfg: PolicyConfig, lora: LoraSettings | None = None, with_engine: bool = True,
                for_training: bool = False, activation_checkpointing: bool = False) -> TrainablePolicy:
    """The model and its chat format, and (with_engine) the inference engine `cfg.engine` names.
    `for_training`: the weights in `training_dtype` (float32 masters); `activation_checkpointing`: see
    enable_activation_checkpointing. An engine with its own copy (vLLM) still loads `cfg.dtype`."""
    policy = load_policy(cfg.model, dtype=training_dtype(cfg, lora) if for_training else cfg.dtype, device=cfg.device)
    if lora is not None:
        from peft import LoraConfig, get_peft_model

        policy.model = get_peft_model(
            policy.model,
            LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=lora.target_modules),
        )
    if activation_checkpointing:
        enable_activation_checkpointing(policy.model)
    policy.model.train()
    chat = ChatFormat(policy.processor, system_prompt=PROMPTS[cfg.prompt])
    choices = ActionGrammar.from_chat(chat).word_ids if cfg.reply_grammar == "action" else None
    engine = make_engine(cfg, policy.model, chat) if with_engine else None
    return TrainablePolicy(policy, chat, engine, cfg, choices)
