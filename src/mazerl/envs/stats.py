"""Per-episode statistics, updated turn by turn as the episode runs.

Definitions (used everywhere, reports included):
- revisit: a move into a square the agent had already stood on; revisit rate = revisits / moves.
- loop: some square visited >= 3 times, or an A-B-A-B oscillation in the positions.
- dead-end entry: a move from the route network (every route between start and goal, plus loops)
  into a dead-end pocket (see `mazes.solver.dead_end_pockets`); its recovery = turns until the
  agent is back on the route network. A pocket still occupied at the end is "unrecovered".
- premature stop: `stop` anywhere but the goal. timeout: the turn budget ran out without `stop`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from ..mazes.layout import Position


@dataclass
class EpisodeStats:
    optimal_moves: int
    max_turns: int
    turns: int = 0
    moves: int = 0
    wall_bumps: int = 0
    parse_failures: int = 0
    revisits: int = 0
    max_visits: int = 1
    oscillation: bool = False
    loop_closures: int = 0  # moves that made a loop: a square's 3rd (or later) visit, or the 4th square of A-B-A-B
    dead_end_entries: int = 0
    recovery_turns: list[int] = field(default_factory=list)
    unrecovered_dead_end: bool = False
    stopped: bool = False
    success: bool = False
    premature_stop: bool = False
    timeout: bool = False
    reached_goal: bool = False  # stood on the goal at some point, stop or not
    actions: list[str] = field(default_factory=list)  # "invalid" for parse failures
    path: list[Position] = field(default_factory=list)  # position after each turn, start first

    @property
    def loop(self) -> bool:
        return self.max_visits >= 3 or self.oscillation

    @property
    def revisit_rate(self) -> float:
        return self.revisits / self.moves if self.moves else 0.0

    @property
    def spl(self) -> float:
        """Success weighted by path length (Anderson et al., 2018): optimal / max(optimal, turns used)."""
        if not self.success:
            return 0.0
        return self.optimal_moves / max(self.optimal_moves, self.moves, 1) if self.optimal_moves else 1.0

    def as_dict(self) -> dict:
        out = asdict(self)
        out["path"] = [list(p) for p in self.path]
        out.update(loop=self.loop, revisit_rate=self.revisit_rate, spl=self.spl)
        return out


class StatsTracker:
    """Feeds an EpisodeStats from the env's transitions. `pockets` marks dead-end squares."""

    def __init__(self, start: Position, goal: Position, optimal_moves: int, max_turns: int, pockets: np.ndarray):
        self.stats = EpisodeStats(optimal_moves=optimal_moves, max_turns=max_turns, path=[start])
        self._goal = goal
        self._pockets = pockets
        self._visits: dict[Position, int] = {start: 1}
        self._pocket_since: int | None = 0 if pockets[start] else None
        self._recent: list[Position] = [start]  # last 4 positions after real moves
        self.stats.reached_goal = start == goal

    def record(self, action: str | None, before: Position, after: Position, bumped: bool) -> None:
        st = self.stats
        st.turns += 1
        st.actions.append(action if action is not None else "invalid")
        st.path.append(after)
        if action is None:
            st.parse_failures += 1
        elif bumped:
            st.wall_bumps += 1
        elif after != before:
            st.moves += 1
            seen = self._visits.get(after, 0)
            if seen:
                st.revisits += 1
            self._visits[after] = seen + 1
            st.max_visits = max(st.max_visits, seen + 1)
            if after == self._goal:
                st.reached_goal = True
            if self._check_oscillation(after) or seen + 1 >= 3:
                st.loop_closures += 1
            in_pocket = bool(self._pockets[after])
            if in_pocket and self._pocket_since is None:
                st.dead_end_entries += 1
                self._pocket_since = st.turns
            elif not in_pocket and self._pocket_since is not None:
                st.recovery_turns.append(st.turns - self._pocket_since)
                self._pocket_since = None
        if action == "stop":
            st.stopped = True
            st.success = after == self._goal
            st.premature_stop = not st.success

    def _check_oscillation(self, after: Position) -> bool:
        """Whether this move completes an A-B-A-B bounce. Only real moves count (bumps do not)."""
        recent = self._recent
        recent.append(after)
        if len(recent) > 4:
            del recent[0]
        bounced = len(recent) == 4 and recent[0] == recent[2] and recent[1] == recent[3]
        self.stats.oscillation |= bounced
        return bounced

    def mark_goal_reached_success(self) -> None:
        """With terminate-on-goal shaping, arriving on the goal ends the episode as a success."""
        self.stats.success = True

    def finish(self, timed_out: bool) -> EpisodeStats:
        st = self.stats
        st.timeout = timed_out and not st.stopped
        st.unrecovered_dead_end = self._pocket_since is not None and st.dead_end_entries > 0
        return st
