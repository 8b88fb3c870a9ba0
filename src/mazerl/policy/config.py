"""How a policy is opened and how it sees mazes (PolicyConfig), and LoRA adapter settings.

Used by training and by evaluation alike, so neither needs the other's package."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .sampling import HistoryConfig, SamplingParams


class VLLMSettings(BaseModel):
    """How the vLLM engine is sized (engine: vllm)."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    SOLE_GPU_SHARE: ClassVar[float] = 0.85  # an engine with a GPU of its own (split placement, evaluation)

    # upper bounds: vLLM refuses more only when the engine starts, on the GPU
    # None: derived from the history, the turn budget and max_new_tokens (cluster/plan.py); a value set below
    # what the history needs is refused, never raised
    max_model_len: int | None = Field(None, ge=64, le=1_048_576, description="longest prompt + reply, in tokens (None: derived)")
    max_images_per_prompt: int | None = Field(None, ge=1, le=1_024, description="images one prompt may carry (None: derived)")
    # None: an engine alone on its GPU takes SOLE_GPU_SHARE; one colocated with a training rank takes what the rank
    # leaves at its peak beside it, less a margin (cluster/plan.py); a value set too large for that is refused
    gpu_memory_utilization: float | None = Field(
        None, gt=0.0, le=1.0, description="GPU share vLLM may take (None: derived; colocated: what training leaves)")
    enable_sleep_mode: bool = Field(False, description="sleep during updates (GPU only; colocated mode)")


class PolicyConfig(BaseModel):
    """Which model, and how mazes are shown to it."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    model: str = Field(description="model directory or hub id (cluster: Qwen/Qwen3-VL-8B-Instruct)")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="the weights' dtype for inference (engines, evaluation, the KL anchor); in training, "
        "what the policy computes in: the trained weights, their gradients and AdamW state are float32 "
        "(policy.trainable.training_dtype)")
    device: str = Field("cpu", description="cpu, cuda or cuda:N; a GPU is looked for when the model is opened")
    prompt: Literal["full", "short"] = Field("full", description="system prompt; 'short' saves tokens for the tiny model")
    history: HistoryConfig = HistoryConfig()
    render_scale: float = Field(1.0, gt=0.0, le=8.0, description="draw mazes at square_px x this (tiny model: 1.28 -> 32 px)")
    max_new_tokens: int = Field(16, ge=1, le=32768, description="per turn (reference run: 1024)")
    max_batch: int = Field(64, ge=1, description="sequences per generate call")
    engine: Literal["hf", "vllm"] = Field("hf", description="inference engine for rollouts and evaluation (rollout/factory.py)")
    vllm: VLLMSettings = Field(default_factory=lambda: VLLMSettings(), description="used when engine is 'vllm'")
    reply_grammar: Literal["free", "action"] = Field(
        "free", description="'action': every reply is exactly <action>WORD</action> (decoding constrained, same in training)")

    VIEW_FILE: ClassVar[str] = "mazerl_policy.json"
    VIEW_FIELDS: ClassVar[tuple[str, ...]] = ("history", "render_scale", "max_new_tokens", "prompt", "reply_grammar")

    def sampling(self, temperature: float = 0.0, seed: int = 0, top_p: float = 1.0,
                 banned_ids: tuple[int, ...] = ()) -> SamplingParams:
        """How this policy generates (0 = greedy). Use TrainablePolicy.sampling, which adds the chat
        format's banned tokens: the one place sampling settings are assembled."""
        if self.reply_grammar == "action" and top_p < 1.0:
            raise ValueError("top_p < 1 is not supported with reply_grammar 'action' (five choices: use temperature)")
        return SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=self.max_new_tokens, seed=seed,
                              grammar=self.reply_grammar, banned_ids=tuple(banned_ids))

    def view(self) -> dict:
        """How this policy sees mazes; saved beside trained weights so evaluation uses the same view."""
        return self.model_dump(mode="json", include=set(self.VIEW_FIELDS))

    @field_validator("device")
    @classmethod
    def _device_name(cls, device: str) -> str:
        from ..policy.loading import check_device_name

        return check_device_name(device)

    @model_validator(mode="before")
    @classmethod
    def _saved_view(cls, data):
        """A model directory carries the view it was trained with (mazerl_policy.json): settings not
        given explicitly come from it, so `model: tiny-base` alone is a complete policy config."""
        if isinstance(data, dict) and isinstance(data.get("model"), str):
            import json
            from pathlib import Path

            from ..policy.loading import resolve_model_name

            data = dict(data)
            data["model"] = resolve_model_name(data["model"])
            saved = cls.saved_view(data["model"]) or {}
            for key in cls.VIEW_FIELDS:
                if key not in data and key in saved:
                    data[key] = saved[key]
        return data

    @classmethod
    def saved_view(cls, model: str) -> dict | None:
        """The view settings saved in a model directory (mazerl_policy.json), checked field by field;
        None when the directory has none. A damaged file is a PolicyLoadError naming it."""
        import json
        from pathlib import Path

        from pydantic import ValidationError, create_model

        from ..policy.loading import PolicyLoadError

        view = Path(model) / cls.VIEW_FILE
        if not view.is_file():
            return None
        try:
            saved = json.loads(view.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as err:
            raise PolicyLoadError(f"{view} is not valid JSON ({err})") from None
        if not isinstance(saved, dict):
            raise PolicyLoadError(f"{view} must hold a JSON object of view settings ({', '.join(cls.VIEW_FIELDS)})")
        fields = {k: (cls.model_fields[k].annotation, cls.model_fields[k]) for k in cls.VIEW_FIELDS}
        checker = create_model("SavedView", __config__=ConfigDict(allow_inf_nan=False, extra="ignore"), **fields)
        try:
            checker.model_validate(saved)
        except ValidationError as err:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
            raise PolicyLoadError(f"{view} holds invalid view settings ({problems})") from None
        return {k: saved[k] for k in cls.VIEW_FIELDS if k in saved}

    @classmethod
    def for_model(cls, model: str, **overrides) -> "PolicyConfig":
        """Settings for a model directory: its saved view (if any), then `overrides` (None = keep)."""
        return cls.model_validate({"model": model, **{k: v for k, v in overrides.items() if v is not None}})


class LoraSettings(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    r: int = Field(16, ge=1, le=4_096, description="rank (above the model's hidden size it adds nothing but memory)")
    alpha: int = Field(32, ge=1, le=65_536, description="scale alpha / r of the adapter's update")
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
