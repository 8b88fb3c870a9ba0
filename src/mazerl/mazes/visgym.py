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

from .layout import MAX_GRID_SIDE, Maze, MazeError

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
    # bool is an int subclass: [true, true] must not pass for (1, 1)
    if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        raise FixtureError(f"{where} must be [row, col] (two integers; true/false are not numbers here), got {value!r}")
    return value[0], value[1]


def _count(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise FixtureError(f"{where} must be a whole number >= 0, got {value!r}")
    return value


def load_visgym_fixture(path: str | Path) -> list[VisGymEpisode]:
    from ..config import ConfigError, read_text_file

    path = Path(path)
    try:
        doc = json.loads(read_text_file(path, "fixture file"))
    except ConfigError as err:
        raise FixtureError(str(err)) from None
    except json.JSONDecodeError as err:
        raise FixtureError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("episodes"), list):
        raise FixtureError(f"{path}: expected an object with an 'episodes' list")
    episodes = []
    seen: dict[tuple[str, int], int] = {}
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
        seed = raw["seed"]
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise FixtureError(f"{where}.seed must be a whole number >= 0, got {seed!r}")
        if (env_id, seed) in seen:
            raise FixtureError(f"{where}: {env_id} seed {seed} is recorded twice (also episodes[{seen[(env_id, seed)]}]); "
                               "each episode must appear once")
        seen[(env_id, seed)] = i
        start = _pair(raw["agent"], f"{where}.agent")
        goal = _pair(raw["target"], f"{where}.target")
        rows = raw["maze_map"]
        if not isinstance(rows, list) or not rows or len(rows) > MAX_GRID_SIDE or not all(
                isinstance(r, list) and 0 < len(r) <= MAX_GRID_SIDE for r in rows):
            raise FixtureError(f"{where}.maze_map must be a list of rows of 0/1, at most {MAX_GRID_SIDE}x{MAX_GRID_SIDE}")
        if any(isinstance(v, bool) for r in rows for v in r):
            raise FixtureError(f"{where}.maze_map must hold 0 (floor) and 1 (wall), not true/false")
        try:
            grid = np.asarray(rows, dtype=np.int64)
        except (ValueError, TypeError):
            raise FixtureError(f"{where}.maze_map must be a rectangular list of rows of 0/1 integers") from None
        if grid.ndim != 2 or not np.isin(grid, (0, 1)).all():
            raise FixtureError(f"{where}.maze_map must be a rectangular list of rows of 0/1 integers")
        try:
            maze = Maze(grid=grid.astype(np.uint8), start=start, goal=goal, algorithm="visgym-wilson", seed=seed)
        except MazeError as err:
            field = "agent" if "start" in str(err) else "target" if "goal" in str(err) else "maze_map"
            raise FixtureError(f"{where}.{field}: {err}") from None
        if start == goal:
            raise FixtureError(f"{where}: agent and target are the same square {start}")
        steps = []
        for j, st in enumerate(raw.get("random_steps") or []):
            if not isinstance(st, dict) or any(k not in st for k in _STEP_KEYS):
                raise FixtureError(f"{where}.random_steps[{j}] needs keys {', '.join(_STEP_KEYS)}")
            try:
                reward = float(st["reward"])
            except (TypeError, ValueError):
                raise FixtureError(f"{where}.random_steps[{j}].reward must be a number, got {st['reward']!r}") from None
            steps.append(
                VisGymStep(
                    action=str(st["action"]),
                    agent=_pair(st["agent"], f"{where}.random_steps[{j}].agent"),
                    reward=reward,
                    terminated=bool(st["terminated"]),
                    feedback=str(st["feedback"]),
                )
            )
        shape = raw.get("image_shape")
        episodes.append(
            VisGymEpisode(
                env_id=env_id,
                seed=seed,
                maze=maze,
                shortest_path_moves=_count(raw["shortest_path_moves"], f"{where}.shortest_path_moves"),
                image_shape=tuple(shape) if shape else None,
                steps=tuple(steps),
            )
        )
    if not episodes:
        raise FixtureError(f"{path}: the 'episodes' list is empty")
    return episodes
