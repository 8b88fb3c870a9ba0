"""Breadth-first search over floor squares, and the structure of a maze around its solution."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from .layout import MOVES, FLOOR, Maze, MazeError, Position


def distances_from(grid: np.ndarray, source: Position) -> np.ndarray:
    """BFS distance in moves from `source` to every square; -1 for walls and unreachable squares."""
    h, w = grid.shape
    flat = grid.ravel().tolist()
    dist = [-1] * (h * w)
    s = source[0] * w + source[1]
    dist[s] = 0
    queue = deque([s])
    offsets = (1, -w, -1, w)  # right, up, left, down; the outer wall keeps us in bounds
    pop, push = queue.popleft, queue.append
    while queue:
        u = pop()
        du = dist[u] + 1
        for off in offsets:
            v = u + off
            if flat[v] == FLOOR and dist[v] < 0:
                dist[v] = du
                push(v)
    return np.asarray(dist, dtype=np.int32).reshape(h, w)


def solve(grid: np.ndarray, start: Position, goal: Position) -> list[str]:
    """A shortest move sequence from start to goal (ties broken right, up, left, down)."""
    to_goal = distances_from(grid, goal)
    return moves_along(to_goal, start)


def moves_along(to_goal: np.ndarray, start: Position) -> list[str]:
    """Follow a distance-to-goal map downhill from `start`."""
    r, c = start
    d = int(to_goal[r, c])
    if d < 0:
        raise MazeError(f"the goal cannot be reached from {start}")
    moves: list[str] = []
    while d > 0:
        for name, (dr, dc) in MOVES.items():
            if to_goal[r + dr, c + dc] == d - 1:
                moves.append(name)
                r, c, d = r + dr, c + dc, d - 1
                break
    return moves


def open_neighbour_counts(grid: np.ndarray) -> np.ndarray:
    """For each square, how many of its 4 neighbours are floor (0 on walls)."""
    floor = (grid == FLOOR).astype(np.int8)
    counts = np.zeros_like(floor)
    counts[1:-1, 1:-1] = floor[:-2, 1:-1] + floor[2:, 1:-1] + floor[1:-1, :-2] + floor[1:-1, 2:]
    return np.where(floor == 1, counts, 0)


def dead_end_pockets(grid: np.ndarray, keep: tuple[Position, ...]) -> np.ndarray:
    """Squares that lie in dead-end branches: what repeated pruning of leaves removes.

    Squares in `keep` (start and goal) are never pruned, so what remains is every route between
    them plus any loops; everything pruned is a pocket the agent must back out of.
    """
    h, w = grid.shape
    flat = grid.ravel()
    degree = open_neighbour_counts(grid).ravel().tolist()
    alive = (flat == FLOOR).tolist()
    protected = {r * w + c for r, c in keep}
    offsets = (1, -w, -1, w)
    stack = [i for i, a in enumerate(alive) if a and degree[i] <= 1 and i not in protected]
    pocket = [False] * (h * w)
    while stack:
        u = stack.pop()
        if not alive[u]:
            continue
        alive[u] = False
        pocket[u] = True
        for off in offsets:
            v = u + off
            if alive[v]:
                degree[v] -= 1
                if degree[v] <= 1 and v not in protected:
                    stack.append(v)
    return np.asarray(pocket, dtype=bool).reshape(h, w)


@dataclass(frozen=True)
class MazeAnalysis:
    """What makes a maze hard: route length, forks along it, dead ends, turns."""

    shortest_path_moves: int
    solution: tuple[str, ...]
    dead_end_cells: int  # cells (odd, odd) with exactly one open neighbour
    forks_on_solution: int  # squares on the route with more than one way onward
    turns_on_solution: int  # direction changes along the route
    dead_ends_next_to_solution: int  # pocket entrances that branch off the route
    pocket_squares: int  # squares in dead-end pockets (see dead_end_pockets)


def analyse(maze: Maze) -> MazeAnalysis:
    grid = maze.grid
    solution = solve(grid, maze.start, maze.goal)
    degree = open_neighbour_counts(grid)
    cells = degree[1::2, 1::2]
    dead_end_cells = int(np.count_nonzero(cells == 1))
    path = [maze.start]
    r, c = maze.start
    for m in solution:
        dr, dc = MOVES[m]
        r, c = r + dr, c + dc
        path.append((r, c))
    # A choice point: the start with 2+ exits, or a later square with 3+ (one is where we came from).
    forks = sum(1 for i, (r, c) in enumerate(path[:-1]) if degree[r, c] >= (2 if i == 0 else 3))
    turns = sum(1 for a, b in zip(solution, solution[1:]) if a != b)
    pockets = dead_end_pockets(grid, (maze.start, maze.goal))
    on_path = set(path)
    entrances = 0
    for r, c in on_path:
        for dr, dc in MOVES.values():
            if pockets[r + dr, c + dc]:
                entrances += 1
    return MazeAnalysis(
        shortest_path_moves=len(solution),
        solution=tuple(solution),
        dead_end_cells=dead_end_cells,
        forks_on_solution=forks,
        turns_on_solution=turns,
        dead_ends_next_to_solution=entrances,
        pocket_squares=int(pockets.sum()),
    )
