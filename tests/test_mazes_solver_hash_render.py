import numpy as np
import pytest
from PIL import Image
from pydantic import ValidationError

from mazerl.mazes.hashing import _d4, layout_hash, walls_hash
from mazerl.mazes.layout import MOVES, Maze
from mazerl.mazes.render import FrameRenderer, RenderOptions, render_ascii, render_rgb
from mazerl.mazes.sampling import sample_maze
from mazerl.mazes.solver import analyse, dead_end_pockets, solve
from mazerl.mazes.visgym import load_visgym_fixture

# A hand-built 3x3-cell maze, start S top-left, goal G bottom-right:
#   #######
#   #S....#   route: right x4, down x4 (8 moves)
#   #.###.#   pocket 1: down the left side and along the bottom, (2,1)..(5,3), ends at (5,3)
#   #.#...#   pocket 2: (3,4)-(3,3), branching off the route at (3,5)
#   #.###.#
#   #...#G#
#   #######
HAND = np.array(
    [
        [1, 1, 1, 1, 1, 1, 1],
        [1, 0, 0, 0, 0, 0, 1],
        [1, 0, 1, 1, 1, 0, 1],
        [1, 0, 1, 0, 0, 0, 1],
        [1, 0, 1, 1, 1, 0, 1],
        [1, 0, 0, 0, 1, 0, 1],
        [1, 1, 1, 1, 1, 1, 1],
    ],
    dtype=np.uint8,
)
HAND_MAZE = Maze(grid=HAND, start=(1, 1), goal=(5, 5))


def walk(start, moves):
    r, c = start
    for m in moves:
        dr, dc = MOVES[m]
        r, c = r + dr, c + dc
    return r, c


def test_solver_finds_the_route_of_a_hand_built_maze():
    moves = solve(HAND, (1, 1), (5, 5))
    assert moves == ["right"] * 4 + ["down"] * 4


def test_pockets_and_analysis_of_a_hand_built_maze():
    pockets = dead_end_pockets(HAND, ((1, 1), (5, 5)))
    assert {tuple(p) for p in np.argwhere(pockets)} == {(2, 1), (3, 1), (4, 1), (5, 1), (5, 2), (5, 3), (3, 3), (3, 4)}
    a = analyse(HAND_MAZE)
    assert a.shortest_path_moves == 8
    assert a.turns_on_solution == 1
    assert a.forks_on_solution == 2  # the start opens right and down; (3,5) opens left and down
    assert a.dead_ends_next_to_solution == 2
    assert a.dead_end_cells == 3  # (5,3), (3,3) and the goal (5,5)


def test_solver_matches_visgym_shortest_paths(visgym_fixture):
    for ep in load_visgym_fixture(visgym_fixture):
        moves = solve(ep.maze.grid, ep.maze.start, ep.maze.goal)
        assert len(moves) == ep.shortest_path_moves
        assert walk(ep.maze.start, moves) == ep.maze.goal


def test_canonical_hash_is_invariant_under_the_8_symmetries():
    m = sample_maze("wilson", (4, 6), 3)
    images = list(_d4(m.grid, (m.start, m.goal)))
    assert len({g.tobytes() + bytes(str(p), "ascii") for g, p in images}) == 8
    assert {layout_hash(g, *p) for g, p in images} == {layout_hash(m.grid, m.start, m.goal)}
    assert {walls_hash(g) for g, _ in images} == {walls_hash(m.grid)}


def test_hash_separates_start_goal_but_walls_hash_does_not():
    m = sample_maze("wilson", (4, 4), 5)
    assert layout_hash(m.grid, m.start, m.goal) != layout_hash(m.grid, m.goal, m.start)
    assert walls_hash(m.grid) != walls_hash(sample_maze("wilson", (4, 4), 6).grid)


def test_pixel_parity_with_visgym_frames(visgym_fixture, visgym_png_dir):
    eps = {(ep.level, ep.seed): ep for ep in load_visgym_fixture(visgym_fixture)}
    for png in sorted(visgym_png_dir.glob("maze_2d_*_seed*.png")):
        level, seed = png.stem.removeprefix("maze_2d_").split("_seed")
        ep = eps[(level, int(seed))]
        ours = render_rgb(ep.maze.grid, ep.maze.start, ep.maze.goal)
        ref = np.asarray(Image.open(png).convert("RGB"))
        assert ours.shape == ref.shape
        differ = (ours != ref).any(-1)
        # Walls, floor and goal match exactly; only the agent disc's rim may differ.
        s = 25
        r, c = ep.maze.start
        outside_agent = np.ones_like(differ)
        outside_agent[r * s : (r + 1) * s, c * s : (c + 1) * s] = False
        assert not differ[outside_agent].any(), png.name
        print(f"{png.name}: {int(differ.sum())} differing pixels (agent disc rim)")
        assert differ.sum() <= 12, png.name


@pytest.mark.parametrize(
    "options",
    [
        RenderOptions(),
        RenderOptions(palette="inverted", square_px=20),
        RenderOptions(palette="swapped", agent_marker="diamond", goal_marker="ring"),
        RenderOptions(wall_style="thin", square_px=32, agent_marker="square", goal_marker="disc"),
    ],
)
def test_incremental_frames_equal_full_renders(options):
    m = sample_maze("braided", (5, 5), 11)
    renderer = FrameRenderer(m.grid, m.goal, options)
    frame = renderer.frame(m.start)
    pos = m.start
    rng = np.random.default_rng(0)
    for _ in range(200):
        move = list(MOVES.values())[rng.integers(4)]
        nxt = (pos[0] + move[0], pos[1] + move[1])
        if m.grid[nxt]:
            continue
        renderer.move_agent(frame, pos, nxt)
        pos = nxt
        assert np.array_equal(frame, render_rgb(m.grid, pos, m.goal, options))
    assert frame.shape == (11 * options.square_px, 11 * options.square_px, 3)


def test_render_options_change_the_picture():
    m = sample_maze("wilson", (4, 4), 1)
    base = render_rgb(m.grid, m.start, m.goal)
    for opts in (RenderOptions(palette="inverted"), RenderOptions(wall_style="thin"), RenderOptions(goal_marker="ring")):
        assert not np.array_equal(render_rgb(m.grid, m.start, m.goal, opts), base)


def test_bad_render_options_name_the_field():
    with pytest.raises(ValidationError, match="palette"):
        RenderOptions(palette="neon")
    with pytest.raises(ValidationError, match="square_px"):
        RenderOptions(square_px=2)


def test_ascii_rendering():
    text = render_ascii(HAND, (1, 1), (5, 5))
    assert text.splitlines()[1] == "#A....#"
    assert text.splitlines()[5] == "#...#G#"
    assert render_ascii(HAND, (5, 5), (5, 5)).splitlines()[5] == "#...#*#"
