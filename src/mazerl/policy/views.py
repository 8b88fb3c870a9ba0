"""Named views: how a model is shown mazes, for models that carry no mazerl_policy.json.

A model mazerl trained saves its view beside its weights (PolicyConfig.VIEW_FILE). A model trained
elsewhere (a hub model, a checkpoint of the SkyRL VisGym recipe) has none; it is evaluated with a view
named explicitly (`mazerl eval --view NAME`, the pipeline's `model_view`), never with silent defaults.

- `visgym`: the view of SkyRL's VisGym maze_2d recipe that started from Qwen/Qwen3-VL-8B-Instruct
  (NovaSky-AI/SkyRL examples/train/visgym: run_visgym_from_instruct.sh, env_instruct.py): the task
  prompt asking for `<action>ACTION</action>` at the end of a free-form reply (mazerl's "full" prompt
  says the same in our own words), every earlier turn and image kept, free-form replies (no grammar),
  1024 new tokens a turn (generator.sampling_params.max_generate_length), the maze drawn at VisGym's
  25 px a square (render scale 1). Its turn budget (18, generator.max_turns) and reward (1.0 for stop
  on the goal) are the environment's and the split's, not the view's: the reference splits carry 18.
- `mazerl`: PolicyConfig's own defaults, read from its fields so the two cannot drift apart.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from ..errors import UserError


class ViewError(UserError, ValueError):
    """An unknown view name, or a model that carries no view and was given none."""


@dataclass(frozen=True)
class NamedView:
    name: str
    description: str
    settings: dict  # PolicyConfig view fields (PolicyConfig.VIEW_FIELDS), as JSON values
    recipe: dict = field(default_factory=dict)  # facts of the recipe the view comes from that live elsewhere (turns, reward)


def _visgym() -> NamedView:
    from ..mazes.visgym import VISGYM_MAX_TURNS

    return NamedView(
        name="visgym",
        description="the SkyRL VisGym maze_2d recipe (Qwen3-VL-8B-Instruct): full prompt, full history, "
                    "free-form replies ending <action>ACTION</action>, 1024 new tokens a turn",
        settings={"prompt": "full", "history": {"turns": None, "images": None}, "reply_grammar": "free",
                  "max_new_tokens": 1024, "render_scale": 1.0},
        recipe={"source": "NovaSky-AI/SkyRL examples/train/visgym/run_visgym_from_instruct.sh, env_instruct.py",
                "model": "Qwen/Qwen3-VL-8B-Instruct", "env_id": "maze_2d/easy", "max_turns": VISGYM_MAX_TURNS,
                "reward": "1.0 for stop on the goal, else 0", "reply": "<action>ACTION</action>, the last one counts"},
    )


def _mazerl() -> NamedView:
    from .config import PolicyConfig

    fields = PolicyConfig.model_fields
    defaults = {k: fields[k].get_default(call_default_factory=True) for k in PolicyConfig.VIEW_FIELDS}
    settings = {k: v.model_dump(mode="json") if hasattr(v, "model_dump") else v for k, v in defaults.items()}
    return NamedView(name="mazerl", description="mazerl's own defaults (PolicyConfig): full prompt, full history, "
                     f"free-form replies, {settings['max_new_tokens']} new tokens a turn", settings=settings)


_BUILDERS = {"visgym": _visgym, "mazerl": _mazerl}
VIEW_NAMES = tuple(_BUILDERS)


def views_listed() -> str:
    """Every named view with what it is, for error messages and help."""
    return "; ".join(f"{v.name} ({v.description})" for v in (named_view(n) for n in VIEW_NAMES))


def named_view(name: str) -> NamedView:
    """The view called `name`; an unknown name is a ViewError listing the views."""
    if name not in _BUILDERS:
        raise ViewError(f"unknown view {name!r}: allowed {', '.join(VIEW_NAMES)} — {views_listed()}")
    return _BUILDERS[name]()


def view_hash(settings: dict) -> str:
    """A short fingerprint of view settings (canonical JSON): equal views, equal hashes."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class ChosenView:
    """The view a model is evaluated with, and where it came from."""

    name: str  # a named view, or "saved" (the model's own mazerl_policy.json)
    settings: dict  # view fields to apply (a saved file may hold only some; PolicyConfig fills the rest as before)
    source: str  # what a reader is told: "named view visgym" or the file's path
    replaced: dict | None = None  # the model's saved view that an explicit named view took the place of

    def record(self, applied: dict) -> dict:
        """What summary.json keeps: the name, where it came from, and the hash of the settings applied."""
        out = {"name": self.name, "source": self.source, "hash": view_hash(applied)}
        if self.replaced is not None:
            out["replaced_saved_view"] = self.replaced
        return out


def choose_view(model: str, view: str | None, option: str = "--view") -> ChosenView:
    """The rule: an explicit named view wins, also over a model's own mazerl_policy.json (it is the caller's
    choice, e.g. to evaluate a mazerl model as the VisGym recipe shows mazes; what it replaced is recorded).
    None: the model's mazerl_policy.json. Neither: a ViewError listing the views, never silent defaults.
    `option`: how the caller names the setting in messages (--view, the pipeline's model_view)."""
    from .config import PolicyConfig
    from .loading import resolve_model_name

    resolved = resolve_model_name(model)
    if view is not None:
        chosen = named_view(view)  # an unknown name fails before the model's files are read
        saved = PolicyConfig.saved_view(resolved)
        replaced = saved if saved is not None and saved != {k: chosen.settings[k] for k in saved} else None
        return ChosenView(chosen.name, dict(chosen.settings), f"named view {chosen.name}", replaced)
    saved = PolicyConfig.saved_view(resolved)
    if saved is None:
        raise ViewError(f"{model} has no {PolicyConfig.VIEW_FILE} (a model mazerl did not train): say how it is shown "
                        f"the mazes with {option} NAME, one of: {views_listed()}")
    return ChosenView("saved", saved, f"{resolved}/{PolicyConfig.VIEW_FILE}")
