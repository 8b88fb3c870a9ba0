"""mazerl's maze environment as a skyrl-gym text environment, registered as `mazerl-maze`.

Importing this module registers the environment with skyrl-gym, so a SkyRL run names it with
`environment.env_class=mazerl-maze` and reads rows written by `mazerl mazes export --format skyrl`;
`skyrl_gym.make("mazerl-maze", env_config=..., extras=row)` builds it from one such row (extras: the
row's columns other than `prompt` and `env_class`).

The game is mazerl's own `MazeEnv`: replies are parsed by `envs.actions.parse_action` (the last
`<action>ACTION</action>`, or VisGym's `('move', 0..3)` / `('stop', 'stop')`), rewards and episode
statistics are mazerl's, and each turn's user message carries the same text and frame as mazerl's rollout
(policy.prompts.turn_text; the frame before the text, as mazerl's chat format puts it).

Frames travel as OpenAI-style content parts, `{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`:
the form SkyRL's VisGym recipe sends to its inference engines, plain JSON (it crosses Ray and vLLM's chat API
unchanged), and PNG, so the pixels arrive exactly as mazerl drew them.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping
from typing import Any

import numpy as np

from pydantic import ValidationError

from ..errors import UserError, format_validation_error


class SkyRLNotInstalledError(UserError, ImportError):
    """skyrl-gym, which this module adapts to, is not installed."""


try:
    import skyrl_gym
    from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
except ImportError as err:
    raise SkyRLNotInstalledError(
        f"mazerl's SkyRL environment needs skyrl-gym, which cannot be imported ({err}): "
        "install it with pip install 'mazerl[skyrl]'") from None

from ..envs.maze_env import EnvConfig, MazeEnv, MazeTask
from ..mazes.dataset_io import RENDER_COLUMNS, row_maze, whole_number
from .export import SKYRL_ENV_CLASS
from ..mazes.layout import Maze, MazeError
from ..mazes.render import VISGYM_RENDER, RenderOptions
from ..policy.prompts import turn_text

ENV_ID = SKYRL_ENV_CLASS
# What a row must hold to be a maze; `max_turns` is the turn budget (a SkyRL generator sets it to its own
# `generator.max_turns` for every row).
ROW_FIELDS = ("maze_id", "grid", "start", "goal", "max_turns")
# env_config may set mazerl's reward shaping (EnvConfig); the turn budget and the drawing come from the row.
SETTINGS = tuple(name for name in EnvConfig.model_fields if name not in ("max_turns", "render"))
_IGNORED_SETTINGS = ("env_class",)  # SkyRL's own bookkeeping, present in some env configs


class MazeRowError(MazeError):
    """A SkyRL row (extras) or env_config from which no maze episode can be built."""


def frame_part(frame: np.ndarray) -> dict:
    """An RGB frame as an OpenAI-style image content part holding a PNG data URI."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(frame)).save(buf, format="PNG")
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()}}


def frame_from_part(part: Mapping) -> np.ndarray:
    """The RGB frame of an image content part made by `frame_part` (for checks and for custom generators)."""
    from PIL import Image

    url = part["image_url"]["url"]
    head, _, data = url.partition(",")
    if head != "data:image/png;base64":
        raise ValueError(f"not a PNG data URI: {url[:40]!r}")
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB"))


def user_message(text: str, frame: np.ndarray) -> dict:
    """One user turn: the frame, then its text (mazerl's chat format shows the image first)."""
    return {"role": "user", "content": [frame_part(frame), {"type": "text", "text": text}]}


def _settings(env_config: Any) -> dict:
    """mazerl's reward-shaping settings from SkyRL's env_config (a dict or an OmegaConf DictConfig)."""
    from omegaconf import DictConfig, OmegaConf  # comes with skyrl-gym; SkyRL passes DictConfigs

    if env_config is None:
        return {}
    if isinstance(env_config, DictConfig):
        env_config = OmegaConf.to_container(env_config, resolve=True)
    if not isinstance(env_config, Mapping):
        raise MazeRowError(f"{ENV_ID}: env_config must be a mapping of settings, got {type(env_config).__name__}")
    given = {str(k): v for k, v in env_config.items() if k not in _IGNORED_SETTINGS}
    unknown = sorted(set(given) - set(SETTINGS))
    if unknown:
        raise MazeRowError(f"{ENV_ID}: unknown env_config setting(s) {', '.join(unknown)}; allowed: {', '.join(SETTINGS)} "
                           "(the turn budget is the row's max_turns, the drawing the row's drawing columns)")
    return given


def maze_from_row(extras: Mapping) -> tuple[str, Maze, int, RenderOptions]:
    """maze_id, maze, turn budget and drawing of one exported row; a clear error when the row holds no maze."""
    if not isinstance(extras, Mapping):
        raise MazeRowError(f"{ENV_ID}: extras must be a dataset row (a mapping of its columns), got {type(extras).__name__}")
    missing = [c for c in ROW_FIELDS if extras.get(c) is None]
    if missing:
        raise MazeRowError(
            f"{ENV_ID}: the row has no maze: {', '.join(missing)} missing (a row needs {', '.join(ROW_FIELDS)}, "
            "plus optional drawing columns); export rows with: mazerl mazes export --format skyrl SPLIT.parquet --out DIR")
    maze_id = extras["maze_id"]
    if not isinstance(maze_id, str) or not maze_id:
        raise MazeRowError(f"{ENV_ID}: maze_id must be a non-empty string, got {maze_id!r}")
    where = f"{ENV_ID} row (maze_id {maze_id!r})"
    try:
        maze = row_maze(dict(extras), 0, "row")
    except MazeError as err:  # its message starts with "row 0 (maze_id ...)": name the row as SkyRL's
        raise MazeRowError(str(err).replace(f"row row 0 (maze_id {maze_id!r})", where, 1)) from None
    budget = whole_number(extras["max_turns"], where, "max_turns", 1, 10_000)
    drawing = {c: extras[c] for c in RENDER_COLUMNS if extras.get(c) is not None}
    if "square_px" in drawing:
        drawing["square_px"] = whole_number(drawing["square_px"], where, "square_px", 4, 128)
    try:
        render = RenderOptions(**drawing) if drawing else VISGYM_RENDER
    except ValidationError as err:
        raise MazeRowError(format_validation_error(err, f"{where}: drawing columns")) from None
    return maze_id, maze, budget, render


class MazerlMazeEnv(BaseTextEnv):
    """One maze episode for SkyRL: `init(prompt)` adds the first frame, `step(reply)` plays one turn."""

    def __init__(self, env_config: Any = None, extras: Mapping | None = None):
        super().__init__()
        settings = _settings(env_config)
        self.maze_id, maze, self.max_turns, render = maze_from_row({} if extras is None else extras)
        try:
            self.config = EnvConfig(**settings, max_turns=self.max_turns, render=render)
        except ValidationError as err:
            raise MazeRowError(format_validation_error(err, f"{ENV_ID} env_config")) from None
        try:
            task = MazeTask.build(maze, render)
        except ValueError as err:  # the goal cannot be reached
            raise MazeRowError(f"{ENV_ID} row (maze_id {self.maze_id!r}): {err}") from None
        self.env = MazeEnv(task, self.config)
        self._started = False

    def init(self, prompt: list[dict]) -> tuple[list[dict], dict]:
        """The row's prompt (the messages before the first frame) followed by the first frame and its turn text."""
        obs = self.env.reset()
        self.turns = 0
        self._started = True
        first = user_message(turn_text("", 1, self.max_turns), obs.image)
        before = [] if prompt is None else list(prompt)  # a list, or the numpy array pandas reads a list column as
        return [*before, first], {"maze_id": self.maze_id, "max_turns": self.max_turns}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        if not self._started:
            raise RuntimeError(f"{ENV_ID}: call init(prompt) before step()")
        result = self.env.step(action)
        self.turns += 1
        obs = result.observation
        observations = [] if result.done else [
            user_message(turn_text(obs.feedback, self.turns + 1, self.max_turns), obs.image)]
        metadata = {
            "maze_id": self.maze_id,
            "action": result.info["action"],  # None: the reply named no valid action
            "parse_ok": result.info["parse_ok"],
            "bumped": result.info["bumped"],
            "feedback": obs.feedback,
            "position": list(obs.position),
            "episode": self.env.stats.as_dict(),  # mazerl's episode statistics so far (final when done)
        }
        return BaseTextEnvStepOutput(observations=observations, reward=float(result.reward), done=result.done,
                                     metadata=metadata)

    def get_metrics(self) -> dict[str, Any]:
        """The episode's numeric statistics (SkyRL averages them over episodes)."""
        st = self.env.stats
        return {
            "success": float(st.success), "turns": st.turns, "moves": st.moves, "optimal_moves": st.optimal_moves,
            "spl": st.spl, "wall_bumps": st.wall_bumps, "parse_failures": st.parse_failures,
            "revisit_rate": st.revisit_rate, "loop": float(st.loop), "dead_end_entries": st.dead_end_entries,
            "premature_stop": float(st.premature_stop), "timeout": float(st.timeout),
            "reached_goal": float(st.reached_goal),
        }


def register() -> None:
    """Register `mazerl-maze` with skyrl-gym (once; importing this module does it)."""
    if ENV_ID not in skyrl_gym.registry:
        skyrl_gym.register(id=ENV_ID, entry_point=f"{__name__}:MazerlMazeEnv")


register()
