"""The multi-turn maze environment (VisGym `maze_2d` dynamics), one maze or a whole batch.

`reset()` -> Observation; `step(reply)` -> StepResult(observation, reward, done, info).
The agent moves one grid square per action; moving into a wall leaves it in place. The episode
ends on `stop` or when the turn budget runs out; reward 1.0 iff it stops on the goal.
A reply that names no valid action is a parse failure: the turn is used, nothing moves.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..mazes.layout import MOVES, Maze, Position
from ..mazes.render import VISGYM_RENDER, FrameRenderer, RenderOptions, render_ascii
from ..mazes.solver import dead_end_pockets, distances_from
from .actions import ACTION_FORMAT_HELP, parse_action
from .stats import EpisodeStats, StatsTracker

# VisGym's feedback strings, verbatim: the reference model was trained to read them.
FEEDBACK_OK = "Action executed successfully."
FEEDBACK_WALL = "Cannot move into a wall."
FEEDBACK_INVALID = ACTION_FORMAT_HELP


class EnvConfig(BaseModel):
    """Episode rules. Shaping terms are off by default (VisGym: reward only for stopping on the goal)."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid", frozen=True)

    max_turns: int = Field(18, ge=1, le=10_000, description="turn budget; the reference run used 18")
    step_penalty: float = Field(0.0, ge=0.0, description="subtracted every turn")
    wall_bump_penalty: float = Field(0.0, ge=0.0, description="subtracted when a move hits a wall")
    stop_off_goal_penalty: float = Field(
        0.0, ge=0.0,
        description="subtracted when `stop` is said off the goal: such a stop always loses, and with per-move "
        "credit it would otherwise outrank a step away from the goal, which need not",
    )
    format_bonus: float = Field(0.0, ge=0.0, description="added for every reply with a valid action")
    progress_reward: float = Field(
        0.0, ge=0.0,
        description="x (distance to goal before - after) each move: potential-based shaping (Ng et al., 1999), "
        "dense, and it leaves the optimal policy unchanged",
    )
    revisit_penalty: float = Field(
        0.0, ge=0.0, description="subtracted when a move enters a square this episode has already visited: going round "
        "in circles costs, while a dead end may still be backed out of (its way back is charged once per square)")
    loop_penalty: float = Field(
        0.0, ge=0.0, description="subtracted for each move that makes a loop as the loop flag defines it (a square's "
        "third visit, or the move that completes an A-B-A-B bounce): going round in circles costs, a dead end backed "
        "out of once does not")
    dead_end_exit_bonus: float = Field(
        0.0, ge=0.0, description="added when a move leaves a dead-end pocket: credit for recognising a dead end and "
        "backing out of it")
    terminate_on_goal: bool = Field(False, description="end the episode (success) on arrival at the goal")
    end_when_out_of_reach: bool = Field(
        False,
        description="training only: end the episode (as a timeout) as soon as the goal can no longer be reached, "
        "and stopped on, within the turns left; what it would still do cannot change its outcome, so rollouts skip it",
    )
    render: RenderOptions = VISGYM_RENDER


@dataclass(frozen=True)
class MazeTask:
    """Everything about one maze that does not change while it is played; shared by its episodes."""

    maze: Maze
    renderer: FrameRenderer
    to_goal: np.ndarray  # BFS distance to the goal per square
    pockets: np.ndarray  # dead-end pocket squares
    optimal_moves: int

    @classmethod
    def build(cls, maze: Maze, render: RenderOptions = VISGYM_RENDER) -> "MazeTask":
        to_goal = distances_from(maze.grid, maze.goal)
        optimal = int(to_goal[maze.start])
        if optimal < 0:
            raise ValueError(f"maze with start {maze.start} cannot reach goal {maze.goal}")
        return cls(
            maze=maze,
            renderer=FrameRenderer(maze.grid, maze.goal, render),
            to_goal=to_goal,
            pockets=dead_end_pockets(maze.grid, (maze.start, maze.goal)),
            optimal_moves=optimal,
        )


@dataclass
class Observation:
    image: np.ndarray  # (H, W, 3) uint8, read-only view of the env's frame; copy it to keep it
    feedback: str
    turn: int
    position: Position

    def ascii(self, task: MazeTask) -> str:
        return render_ascii(task.maze.grid, self.position, task.maze.goal)


@dataclass
class StepResult:
    observation: Observation
    reward: float
    done: bool
    info: dict = field(default_factory=dict)


class MazeEnv:
    """One maze, played turn by turn."""

    def __init__(self, task: MazeTask | Maze, config: EnvConfig | None = None):
        self.config = config or EnvConfig()
        if isinstance(task, Maze):
            task = MazeTask.build(task, self.config.render)
        self.task = task
        self._grid = task.maze.grid
        self._goal = task.maze.goal
        self._frame = np.empty(0, dtype=np.uint8)
        self._frame_view = self._frame
        self.position: Position = task.maze.start
        self.done = True
        self._tracker: StatsTracker | None = None

    def reset(self) -> Observation:
        maze = self.task.maze
        self.position = maze.start
        self.done = False
        self._frame = self.task.renderer.frame(self.position)
        self._frame_view = self._frame.view()  # read-only; stays current as the frame is repainted
        self._frame_view.flags.writeable = False
        self._tracker = StatsTracker(
            maze.start, maze.goal, self.task.optimal_moves, self.config.max_turns, self.task.pockets
        )
        return self._observation("")

    def _observation(self, feedback: str) -> Observation:
        assert self._tracker is not None
        return Observation(image=self._frame_view, feedback=feedback, turn=self._tracker.stats.turns, position=self.position)

    @property
    def stats(self) -> EpisodeStats:
        if self._tracker is None:
            raise RuntimeError("call reset() before reading stats")
        return self._tracker.stats

    def step(self, reply: object) -> StepResult:
        if self.done or self._tracker is None:
            raise RuntimeError("episode is over (or not started): call reset()")
        cfg = self.config
        action = parse_action(reply)
        before = self.position
        after = before
        bumped = False
        reward = 0.0
        if action is None:
            feedback = FEEDBACK_INVALID
        else:
            reward += cfg.format_bonus
            feedback = FEEDBACK_OK
            if action != "stop":
                dr, dc = MOVES[action]
                target = (before[0] + dr, before[1] + dc)
                if self._grid[target]:
                    bumped = True
                    feedback = FEEDBACK_WALL
                    reward -= cfg.wall_bump_penalty
                else:
                    after = target
        reward -= cfg.step_penalty
        if cfg.progress_reward and after != before:
            to_goal = self.task.to_goal
            reward += cfg.progress_reward * float(to_goal[before] - to_goal[after])
        if after != before:
            self.task.renderer.move_agent(self._frame, before, after)
            self.position = after
        tracker = self._tracker
        revisits, loops, recoveries = tracker.stats.revisits, tracker.stats.loop_closures, len(tracker.stats.recovery_turns)
        tracker.record(action, before, after, bumped)
        if tracker.stats.revisits > revisits:
            reward -= cfg.revisit_penalty
        if tracker.stats.loop_closures > loops:
            reward -= cfg.loop_penalty
        if len(tracker.stats.recovery_turns) > recoveries:
            reward += cfg.dead_end_exit_bonus
        turns = tracker.stats.turns
        reached = cfg.terminate_on_goal and after == self._goal and action != "stop"
        if action == "stop":
            self.done = True
            if after == self._goal:
                reward += 1.0
            else:
                reward -= cfg.stop_off_goal_penalty
        elif reached:
            self.done = True
            tracker.mark_goal_reached_success()
            reward += 1.0
        if turns >= cfg.max_turns and not self.done:
            self.done = True
            tracker.finish(timed_out=True)
        elif not self.done and cfg.end_when_out_of_reach and turns + self._turns_to_finish(after) > cfg.max_turns:
            self.done = True
            tracker.finish(timed_out=True)
        elif self.done:
            tracker.finish(timed_out=False)
        info = {"action": action, "bumped": bumped, "turn": turns, "parse_ok": action is not None}
        return StepResult(self._observation(feedback), reward, self.done, info)

    def _turns_to_finish(self, position: Position) -> int:
        """Fewest turns from `position` to a success: the moves to the goal, plus `stop` unless arrival ends it."""
        return int(self.task.to_goal[position]) + (0 if self.config.terminate_on_goal else 1)

    def render(self) -> np.ndarray:
        """A copy of the current frame."""
        return self._frame.copy()


class MazeEnvBatch:
    """Many episodes stepped together (the rollout loop plays hundreds at once).

    Mazes may differ in size. `step(replies)` takes one reply per episode; episodes that are done
    are skipped (their reply is ignored) and their result is None.
    """

    def __init__(self, tasks: list[MazeTask], config: EnvConfig | None = None):
        self.config = config or EnvConfig()
        self.envs = [MazeEnv(t, self.config) for t in tasks]

    def __len__(self) -> int:
        return len(self.envs)

    def reset(self) -> list[Observation]:
        return [env.reset() for env in self.envs]

    @property
    def done(self) -> list[bool]:
        return [env.done for env in self.envs]

    @property
    def all_done(self) -> bool:
        return all(env.done for env in self.envs)

    def step(self, replies: list[object]) -> list[StepResult | None]:
        if len(replies) != len(self.envs):
            raise ValueError(f"got {len(replies)} replies for {len(self.envs)} episodes")
        return [None if env.done else env.step(r) for env, r in zip(self.envs, replies)]

    def stats(self) -> list[EpisodeStats]:
        return [env.stats for env in self.envs]
