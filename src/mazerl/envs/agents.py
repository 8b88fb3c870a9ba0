"""Built-in reference agents that play through the same environment: the BFS oracle and random."""

from __future__ import annotations

import random

from ..mazes.layout import MOVES
from .maze_env import MazeEnv


def oracle_action(env: MazeEnv) -> str:
    """A shortest-path move from the agent's square (ties: right, up, left, down); stop on the goal."""
    r, c = env.position
    d = int(env.task.to_goal[r, c])
    if d == 0:
        return "stop"
    for name, (dr, dc) in MOVES.items():
        if env.task.to_goal[r + dr, c + dc] == d - 1:
            return name
    raise RuntimeError(f"no downhill move from {env.position}: the goal is unreachable")


def random_action(env: MazeEnv, rng: random.Random) -> str:
    """Uniform over the moves that do not hit a wall, and stop."""
    r, c = env.position
    legal = [name for name, (dr, dc) in MOVES.items() if not env.task.maze.grid[r + dr, c + dc]]
    return rng.choice([*legal, "stop"])


def as_reply(action: str) -> str:
    return f"<action>{action}</action>"
