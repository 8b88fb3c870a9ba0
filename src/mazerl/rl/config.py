"""Configs of the learning jobs: the policy's view of the task, GRPO, and behaviour cloning."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..envs.maze_env import EnvConfig
from ..rollout.engine import SamplingParams
from ..rollout.multiturn import HistoryConfig


class PolicyConfig(BaseModel):
    """Which model, and how mazes are shown to it."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    model: str = Field(description="model directory or hub id (cluster: Qwen/Qwen3-VL-8B-Instruct)")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    prompt: Literal["full", "short"] = Field("full", description="system prompt; 'short' saves tokens for the tiny model")
    history: HistoryConfig = HistoryConfig()
    render_scale: float = Field(1.0, gt=0.0, le=8.0, description="draw mazes at square_px x this (tiny model: 1.28 -> 32 px)")
    max_new_tokens: int = Field(16, ge=1, le=32768, description="per turn (reference run: 1024)")
    max_batch: int = Field(64, ge=1, description="sequences per generate call")
    reply_grammar: Literal["free", "action"] = Field(
        "free", description="'action': every reply is exactly <action>WORD</action> (decoding constrained, same in training)")

    VIEW_FILE: ClassVar[str] = "mazerl_policy.json"
    VIEW_FIELDS: ClassVar[tuple[str, ...]] = ("history", "render_scale", "max_new_tokens", "prompt", "reply_grammar")

    def sampling(self, temperature: float = 0.0, seed: int = 0, top_p: float = 1.0) -> SamplingParams:
        """How this policy generates (0 = greedy): the one place sampling settings are assembled."""
        if self.reply_grammar == "action" and top_p < 1.0:
            raise ValueError("top_p < 1 is not supported with reply_grammar 'action' (five choices: use temperature)")
        return SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=self.max_new_tokens, seed=seed,
                              grammar=self.reply_grammar)

    def view(self) -> dict:
        """How this policy sees mazes; saved beside trained weights so evaluation uses the same view."""
        return self.model_dump(mode="json", include=set(self.VIEW_FIELDS))

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


class OptimConfig(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    lr: float = Field(1e-6, gt=0.0, le=1.0)
    weight_decay: float = Field(0.0, ge=0.0, le=1.0)
    betas: tuple[Annotated[float, Field(ge=0.0, lt=1.0)], Annotated[float, Field(ge=0.0, lt=1.0)]] = (0.9, 0.999)
    warmup_steps: int = Field(0, ge=0)
    schedule: Literal["constant", "cosine"] = "constant"
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, description="cosine floor, as a fraction of lr")
    max_grad_norm: float = Field(1.0, gt=0.0)


class LoraSettings(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


class GRPOConfig(BaseModel):
    """`mazerl train grpo`. Defaults follow SkyRL's VisGym recipe where it applies."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    policy: PolicyConfig
    train_data: str = Field(description="train split parquet")
    eval_data: str | None = Field(None, description="split parquet for the periodic greedy evaluation")
    output_dir: str
    seed: int = Field(0, ge=0)
    steps: int = Field(100, ge=1)
    max_minutes: float | None = Field(None, gt=0.0, description="stop (with a checkpoint) once this much time has passed")
    mazes_per_step: int = Field(32, ge=1, description="prompts per step (B)")
    group_size: int = Field(8, ge=2, description="samples per maze (G)")
    mini_batch_mazes: int | None = Field(None, ge=1, description="mazes per optimizer step (None: all)")
    micro_batch: int = Field(16, ge=1, description="sequences per forward/backward")
    update_turns_per_episode: int | None = Field(
        None, ge=1, description="train on at most this many of each episode's training sequences, drawn at random "
        "(seeded): every turn of an episode shares its advantage, so a sample keeps the gradient unbiased at a fraction "
        "of the update's cost (None: all)")
    temperature: float = Field(1.0, gt=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    clip_low: float = Field(0.2, ge=0.0)
    clip_high: float = Field(0.2, ge=0.0)
    kl_coef: float = Field(0.0, ge=0.0, description="k3 KL to the initial policy (reference run: 0.005)")
    loss_aggregation: Literal["token-mean", "seq-mean"] = "token-mean"
    scale_advantages_by_std: bool = True
    episode_advantage_weight: float = Field(
        1.0, ge=0.0, description="weight of the episode-level (group-normalised episode reward) advantage in every move's "
        "advantage; 0 with turn_advantage_weight > 0 credits each move only against moves from the same state")
    turn_advantage_weight: float = Field(
        0.0, ge=0.0, description="add this x the turn-level advantage of the state a move was made from (GiGPO's "
        "anchor-state groups: same square, same last move and feedback, within a maze's group); 0: episode-level only")
    turn_gamma: float = Field(0.95, ge=0.0, le=1.0, description="discount of the return-to-go behind turn-level advantages")
    positive_advantages_only: bool = Field(
        False, description="train only on moves with a positive advantage (reinforce what worked, RAFT-style): a failed "
        "episode's mostly-correct early moves are not pushed down")
    filter_zero_variance_groups: bool = True
    optim: OptimConfig = OptimConfig()
    lora: LoraSettings | None = None
    freeze_vision: bool = Field(False, description="keep the vision tower fixed: RL adjusts decisions, not perception")
    env: EnvConfig = EnvConfig()
    max_turns: int | None = Field(None, ge=1, description="override the split's per-maze turn budget in training")
    eval_every: int = Field(10, ge=0, description="steps between greedy evaluations (0: never)")
    eval_every_minutes: float | None = Field(
        None, gt=0.0, description="also evaluate each time this much training time has passed (evaluation time not counted)")
    eval_mazes: int = Field(64, ge=1)
    checkpoint_every: int = Field(10, ge=1)
    keep_checkpoints: int = Field(3, ge=1)

    @model_validator(mode="after")
    def _check(self):
        if self.episode_advantage_weight == 0 and self.turn_advantage_weight == 0:
            raise ValueError("episode_advantage_weight and turn_advantage_weight are both 0: no move would get any credit")
        if self.mini_batch_mazes is not None and self.mazes_per_step % self.mini_batch_mazes:
            raise ValueError(
                f"mazes_per_step ({self.mazes_per_step}) must be divisible by mini_batch_mazes ({self.mini_batch_mazes})"
            )
        return self

    @property
    def episodes_per_step(self) -> int:
        return self.mazes_per_step * self.group_size


class SFTConfig(BaseModel):
    """`mazerl train sft`: behaviour cloning on solver moves, in the same multi-turn chat format."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    policy: PolicyConfig
    train_data: str
    eval_data: str | None = None
    output_dir: str
    seed: int = Field(0, ge=0)
    steps: int = Field(700, ge=1)
    max_minutes: float | None = Field(None, gt=0.0, description="stop early when this much time has passed")
    batch_size: int = Field(32, ge=1, description="turns (samples) per optimizer step")
    noise: float = Field(0.1, ge=0.0, lt=1.0, description="chance a turn takes a random move (not learned): teaches recovery")
    optim: OptimConfig = OptimConfig(lr=3e-4, weight_decay=0.01, warmup_steps=20, schedule="cosine", min_lr_ratio=0.1)
    env: EnvConfig = EnvConfig()
    eval_every: int = Field(0, ge=0)
    eval_mazes: int = Field(64, ge=1)
