"""The random agent's exact success probability: the floor any policy must clear.

The random agent picks uniformly among the moves that do not hit a wall, and `stop`. Its chance of
stopping on the goal within the turn budget follows from dynamic programming over (square, turns
left); no simulation needed.
"""

from __future__ import annotations

import numpy as np

from ..mazes.layout import MOVES, Maze


def random_agent_success(maze: Maze, max_turns: int) -> float:
    grid = maze.grid
    floor = np.argwhere(grid == 0)
    index = {tuple(p): i for i, p in enumerate(floor.tolist())}
    n = len(floor)
    goal = index[maze.goal]
    # transition: from square i, each legal move to j with prob 1/(k+1); stop with prob 1/(k+1)
    nxt: list[list[int]] = []
    for r, c in floor.tolist():
        nxt.append([index[(r + dr, c + dc)] for dr, dc in MOVES.values() if grid[r + dr, c + dc] == 0])
    value = np.zeros(n)  # success probability with t turns left; t = 0: none
    for _ in range(max_turns):
        new = np.empty(n)
        for i in range(n):
            k = len(nxt[i]) + 1
            new[i] = ((1.0 if i == goal else 0.0) + sum(value[j] for j in nxt[i])) / k
        value = new
    return float(value[index[maze.start]])
