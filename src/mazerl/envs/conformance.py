"""Replay VisGym recordings through our environment and report every difference."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..mazes.solver import solve
from ..mazes.visgym import VisGymEpisode, load_visgym_fixture
from .maze_env import EnvConfig, MazeEnv

# VisGym's raw env has no turn limit (the 18-turn limit is the instruct wrapper's); traces go to 30.
VISGYM_TURNS_FOR_REPLAY = 64


@dataclass
class EpisodeCheck:
    env_id: str
    seed: int
    steps_checked: int = 0
    mismatches: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches


def check_episode(ep: VisGymEpisode) -> EpisodeCheck:
    result = EpisodeCheck(ep.env_id, ep.seed)
    bfs = len(solve(ep.maze.grid, ep.maze.start, ep.maze.goal))
    if bfs != ep.shortest_path_moves:
        result.mismatches.append(f"shortest path: ours {bfs}, VisGym {ep.shortest_path_moves}")
    env = MazeEnv(ep.maze, EnvConfig(max_turns=max(VISGYM_TURNS_FOR_REPLAY, len(ep.steps) + 1)))
    obs = env.reset()
    if ep.image_shape and tuple(obs.image.shape) != tuple(ep.image_shape):
        result.mismatches.append(f"image shape: ours {tuple(obs.image.shape)}, VisGym {tuple(ep.image_shape)}")
    for i, st in enumerate(ep.steps):
        out = env.step(f"<action>{st.action}</action>")
        result.steps_checked += 1
        ours = (out.observation.position, out.reward, out.done, out.observation.feedback)
        theirs = (st.agent, st.reward, st.terminated, st.feedback)
        for name, a, b in zip(("agent", "reward", "terminated", "feedback"), ours, theirs):
            if a != b:
                result.mismatches.append(f"step {i} ({st.action}): {name} ours {a!r}, VisGym {b!r}")
        if out.done:
            break
    return result


def check_fixture(path: str | Path) -> list[EpisodeCheck]:
    return [check_episode(ep) for ep in load_visgym_fixture(path)]

