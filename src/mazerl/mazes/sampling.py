"""Sample a maze task: a generated layout plus a start and a goal placed by a named rule."""

from __future__ import annotations

import random
from typing import Literal

import numpy as np

from .generators import generate_grid
from .layout import Maze, MazeError
from .solver import distances_from, open_neighbour_counts

Placement = Literal["visgym-corners", "random", "dead-ends"]
PLACEMENTS: tuple[str, ...] = ("visgym-corners", "random", "dead-ends")
_MAX_PLACEMENT_TRIES = 64


def place_visgym_corners(grid: np.ndarray, rng: random.Random) -> tuple[tuple[int, int], tuple[int, int]]:
    """One of the 4 ordered pairs of opposite interior corners, uniformly (VisGym's rule)."""
    h, w = grid.shape
    tl, tr, bl, br = (1, 1), (1, w - 2), (h - 2, 1), (h - 2, w - 2)
    pairs = ((tl, br), (br, tl), (tr, bl), (bl, tr))
    return pairs[rng.randrange(4)]


def _place_among(grid: np.ndarray, candidates: list[tuple[int, int]], min_moves: int, rng: random.Random, rule: str):
    if len(candidates) < 2:
        raise MazeError(f"placement {rule!r} needs at least 2 candidate cells, the maze has {len(candidates)}")
    for _ in range(_MAX_PLACEMENT_TRIES):
        start = candidates[rng.randrange(len(candidates))]
        dist = distances_from(grid, start)
        goals = [p for p in candidates if p != start and dist[p] >= min_moves]
        if goals:
            return start, goals[rng.randrange(len(goals))]
    raise MazeError(
        f"placement {rule!r} found no start/goal pair at least {min_moves} moves apart in a "
        f"{grid.shape[0]}x{grid.shape[1]} grid after {_MAX_PLACEMENT_TRIES} tries; lower min_moves or use a larger maze"
    )


def place_random(grid: np.ndarray, rng: random.Random, min_moves: int):
    h, w = grid.shape
    cells = [(r, c) for r in range(1, h, 2) for c in range(1, w, 2)]
    return _place_among(grid, cells, min_moves, rng, "random")


def place_dead_ends(grid: np.ndarray, rng: random.Random, min_moves: int):
    degree = open_neighbour_counts(grid)
    h, w = grid.shape
    ends = [(r, c) for r in range(1, h, 2) for c in range(1, w, 2) if degree[r, c] == 1]
    return _place_among(grid, ends, min_moves, rng, "dead-ends")


def sample_maze(
    algorithm: str,
    cells: tuple[int, int],
    seed: int,
    placement: str = "visgym-corners",
    min_moves: int = 1,
) -> Maze:
    """A maze from `algorithm` with `cells` = (rows, cols), fully determined by `seed`."""
    rng = random.Random(seed)
    grid = generate_grid(algorithm, cells[0], cells[1], rng)
    if placement == "visgym-corners":
        start, goal = place_visgym_corners(grid, rng)
    elif placement == "random":
        start, goal = place_random(grid, rng, min_moves)
    elif placement == "dead-ends":
        start, goal = place_dead_ends(grid, rng, min_moves)
    else:
        raise MazeError(f"unknown placement {placement!r}: allowed {', '.join(PLACEMENTS)}")
    return Maze(grid=grid, start=start, goal=goal, algorithm=algorithm, seed=seed)
