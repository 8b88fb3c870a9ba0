"""Read VisGym `maze_2d` recordings (the format of shared/fixtures/visgym_maze2d_public.json).

The file is `{"source": str, "episodes": [...]}`; each episode has `env_id` (`maze_2d/easy` or
`maze_2d/hard`), `seed`, `maze_map`, `agent` and `target` ([row, col]), `shortest_path_moves`,
`image_shape` and optionally `random_steps` (action, agent, reward, terminated, feedback).
The package ships one: VisGym's own `maze_2d` easy and hard mazes for seeds 0-63 (the reference
run's evaluation set), recorded from VisGym, at `reference_file()`; any other recording is read by path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .layout import Maze, MazeError

VISGYM_MAX_TURNS = 18  # the instruct wrapper's turn limit in the reference run
REFERENCE_NAME = "visgym_maze2d_reference.json"


def reference_file() -> Path:
    """The shipped VisGym reference recording (easy + hard, seeds 0-63), package data."""
    from importlib.resources import files

    return Path(str(files("mazerl") / "data" / REFERENCE_NAME))
_EPISODE_KEYS = ("env_id", "seed", "maze_map", "agent", "target", "shortest_path_moves")
_STEP_KEYS = ("action", "agent", "reward", "terminated", "feedback")


class FixtureError(MazeError):
    """A VisGym recording that does not have the expected shape."""


@dataclass(frozen=True)
class VisGymStep:
    action: str
    agent: tuple[int, int]
    reward: float
    terminated: bool
    feedback: str


@dataclass(frozen=True)
class VisGymEpisode:
    env_id: str
    seed: int
    maze: Maze
    shortest_path_moves: int
    image_shape: tuple[int, ...] | None
    steps: tuple[VisGymStep, ...]

    @property
    def level(self) -> str:
        return self.env_id.split("/", 1)[-1]


def _pair(value: object, where: str) -> tuple[int, int]:
    if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value)):
        raise FixtureError(f"{where} must be [row, col] (two integers), got {value!r}")
    return value[0], value[1]


def load_visgym_fixture(path: str | Path) -> list[VisGymEpisode]:
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise FixtureError(f"fixture file not found: {path}") from None
    except json.JSONDecodeError as err:
        raise FixtureError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("episodes"), list):
        raise FixtureError(f"{path}: expected an object with an 'episodes' list")
    episodes = []
    for i, raw in enumerate(doc["episodes"]):
        where = f"{path.name}: episodes[{i}]"
        if not isinstance(raw, dict):
            raise FixtureError(f"{where} must be an object")
        missing = [k for k in _EPISODE_KEYS if k not in raw]
        if missing:
            raise FixtureError(f"{where} is missing {', '.join(missing)} (required: {', '.join(_EPISODE_KEYS)})")
        env_id = raw["env_id"]
        if not isinstance(env_id, str) or not env_id.startswith("maze_2d/"):
            raise FixtureError(f"{where}.env_id = {env_id!r}: expected 'maze_2d/<level>'")
        try:
            grid = np.asarray(raw["maze_map"], dtype=np.int64)
            if grid.ndim != 2 or not np.isin(grid, (0, 1)).all():
                raise ValueError("must be a rectangular list of rows of 0/1")
            maze = Maze(
                grid=grid.astype(np.uint8),
                start=_pair(raw["agent"], f"{where}.agent"),
                goal=_pair(raw["target"], f"{where}.target"),
                algorithm="visgym-wilson",
                seed=int(raw["seed"]),
            )
        except (ValueError, TypeError) as err:
            raise FixtureError(f"{where}.maze_map: {err}") from None
        steps = []
        for j, st in enumerate(raw.get("random_steps") or []):
            if not isinstance(st, dict) or any(k not in st for k in _STEP_KEYS):
                raise FixtureError(f"{where}.random_steps[{j}] needs keys {', '.join(_STEP_KEYS)}")
            steps.append(
                VisGymStep(
                    action=str(st["action"]),
                    agent=_pair(st["agent"], f"{where}.random_steps[{j}].agent"),
                    reward=float(st["reward"]),
                    terminated=bool(st["terminated"]),
                    feedback=str(st["feedback"]),
                )
            )
        shape = raw.get("image_shape")
        episodes.append(
            VisGymEpisode(
                env_id=env_id,
                seed=int(raw["seed"]),
                maze=maze,
                shortest_path_moves=int(raw["shortest_path_moves"]),
                image_shape=tuple(shape) if shape else None,
                steps=tuple(steps),
            )
        )
    if not episodes:
        raise FixtureError(f"{path}: the 'episodes' list is empty")
    return episodes
