import random

import numpy as np
import pytest

from mazerl.mazes.generators import GENERATORS, PERFECT_ALGORITHMS, generate_grid
from mazerl.mazes.layout import Maze, MazeError, parse_size
from mazerl.mazes.sampling import sample_maze
from mazerl.mazes.solver import distances_from, open_neighbour_counts


def passages(grid: np.ndarray) -> int:
    """Open squares between two cells = spanning edges."""
    h, w = grid.shape
    return int((grid[1:-1:2, 2:-1:2] == 0).sum() + (grid[2:-1:2, 1:-1:2] == 0).sum())


@pytest.mark.parametrize("algorithm", sorted(GENERATORS))
@pytest.mark.parametrize("cells", [(2, 2), (4, 4), (5, 5), (3, 7), (8, 8), (31, 31)])
def test_generators_connect_every_cell(algorithm, cells):
    grid = generate_grid(algorithm, *cells, random.Random(7))
    assert grid.shape == (2 * cells[0] + 1, 2 * cells[1] + 1)
    assert grid[0].all() and grid[-1].all() and grid[:, 0].all() and grid[:, -1].all()
    assert (grid[::2, ::2] == 1).all(), "posts between cells are always walls"
    dist = distances_from(grid, (1, 1))
    assert (dist[1::2, 1::2] >= 0).all(), "every cell is reachable"
    n_cells = cells[0] * cells[1]
    if algorithm in PERFECT_ALGORITHMS:
        assert passages(grid) == n_cells - 1, "a perfect maze is a spanning tree"
    else:
        assert passages(grid) >= n_cells - 1


def test_braided_mazes_have_loops_and_fewer_dead_ends():
    loops, dead_wilson, dead_braided = 0, 0, 0
    for seed in range(20):
        b = generate_grid("braided", 8, 8, random.Random(seed))
        w = generate_grid("wilson", 8, 8, random.Random(seed))
        loops += passages(b) > 63
        dead_wilson += int((open_neighbour_counts(w)[1::2, 1::2] == 1).sum())
        dead_braided += int((open_neighbour_counts(b)[1::2, 1::2] == 1).sum())
    assert loops == 20
    assert dead_braided < 0.7 * dead_wilson


@pytest.mark.parametrize("algorithm", sorted(GENERATORS))
def test_same_seed_same_maze_other_seed_other_maze(algorithm):
    a = sample_maze(algorithm, (6, 6), 123)
    b = sample_maze(algorithm, (6, 6), 123)
    c = sample_maze(algorithm, (6, 6), 124)
    assert a == b
    assert a != c


def test_generators_differ_in_character():
    # DFS makes long corridors (few dead ends); Prim and Kruskal make many short ones.
    def dead_ends(alg):
        return np.mean([(open_neighbour_counts(generate_grid(alg, 10, 10, random.Random(s)))[1::2, 1::2] == 1).sum() for s in range(15)])

    assert dead_ends("dfs") < dead_ends("wilson") < dead_ends("prim")


def test_visgym_corner_placement_uses_all_four_pairs():
    pairs = {(m.start, m.goal) for m in (sample_maze("wilson", (4, 4), s) for s in range(200))}
    assert pairs == {((1, 1), (7, 7)), ((7, 7), (1, 1)), ((1, 7), (7, 1)), ((7, 1), (1, 7))}


@pytest.mark.parametrize("placement", ["random", "dead-ends"])
def test_other_placements_respect_min_moves(placement):
    for s in range(30):
        m = sample_maze("wilson", (6, 6), s, placement=placement, min_moves=10)
        assert distances_from(m.grid, m.start)[m.goal] >= 10
        assert m.start[0] % 2 == 1 and m.start[1] % 2 == 1
        if placement == "dead-ends":
            deg = open_neighbour_counts(m.grid)
            assert deg[m.start] == 1 and deg[m.goal] == 1


def test_impossible_placement_is_a_clear_error():
    with pytest.raises(MazeError, match="min_moves"):
        sample_maze("wilson", (2, 2), 0, placement="random", min_moves=50)


@pytest.mark.parametrize(
    "value, message",
    [(1, "out of range"), (64, "out of range"), ("big", "unknown maze size"), ((3,), "pair"), ("0x4", "out of range")],
)
def test_bad_sizes_are_rejected(value, message):
    with pytest.raises(MazeError, match=message):
        parse_size(value)


def test_size_forms():
    assert parse_size("visgym-easy") == (4, 4)
    assert parse_size("visgym-hard") == (5, 5)
    assert parse_size("8x6") == (8, 6)
    assert parse_size(31) == (31, 31)


def test_unknown_algorithm_and_placement():
    with pytest.raises(MazeError, match="allowed"):
        sample_maze("eller", (4, 4), 0)
    with pytest.raises(MazeError, match="allowed"):
        sample_maze("wilson", (4, 4), 0, placement="anywhere")


@pytest.mark.parametrize(
    "grid, message",
    [
        (np.ones((8, 9), np.uint8), "odd"),
        (np.zeros((9, 9), np.uint8), "outer wall"),
        (np.ones((3, 3), np.uint8), "smallest"),
        (np.full((9, 9), 2, np.uint8), "0 \\(floor\\) or 1"),
    ],
)
def test_invalid_grids(grid, message):
    with pytest.raises(MazeError, match=message):
        Maze(grid=grid, start=(1, 1), goal=(1, 1))


def test_start_on_wall_is_rejected():
    m = sample_maze("wilson", (4, 4), 0)
    with pytest.raises(MazeError, match="on a wall"):
        Maze(grid=m.grid, start=(0, 0), goal=m.goal)
