"""How a policy generates (SamplingParams) and how much of its episode it sees each turn (HistoryConfig):
settings every engine, the rollout loop and the trainer's log-probabilities read."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..config import Seed, TemperatureOrGreedy


class SamplingParams(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False, extra="forbid", frozen=True)

    temperature: TemperatureOrGreedy = Field(1.0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(16, ge=1, le=32768)
    seed: Seed = 0
    grammar: Literal["free", "action"] = Field(
        "free", description="'action': replies are exactly <action>WORD</action> (policy.grammar)")
    banned_ids: tuple[int, ...] = Field(
        (), description="token ids never sampled; the trainer's log-probabilities give them probability 0 too")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class HistoryConfig(BaseModel):
    """How much of the episode the model sees each turn.

    `turns`: earlier turns kept (None = all). `images`: how many of the most recent turns keep
    their image (None = all). A Markov policy (the frame shows the whole state) needs turns=0.
    """

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid", frozen=True)

    turns: int | None = Field(None, ge=0)
    images: int | None = Field(None, ge=1)
