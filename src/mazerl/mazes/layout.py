"""The maze value type: a wall/floor grid with an outer wall, a start and a goal.

Coordinates are (row, col) in the grid. Cells sit at odd indices; the squares between two cells
are passages (floor) or walls. 1 = wall, 0 = floor. Directions follow VisGym: right = col+1,
up = row-1, left = col-1, down = row+1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from ..errors import UserError

WALL = 1
FLOOR = 0

# Move name -> (d_row, d_col). The order is VisGym's move index order: ('move', 0..3).
MOVES: dict[str, tuple[int, int]] = {"right": (0, 1), "up": (-1, 0), "left": (0, -1), "down": (1, 0)}
MOVE_NAMES: tuple[str, ...] = tuple(MOVES)

MIN_CELLS = 2
MAX_CELLS = 63  # 127x127 grid; well past the "at least 31x31" requirement
MAX_GRID_SIDE = 255  # 127x127 cells: the largest maze a table may hold

# Named sizes in cells (rows, cols). VisGym's easy maze is a 9x9 grid, hard is 11x11.
SIZE_PRESETS: dict[str, tuple[int, int]] = {"visgym-easy": (4, 4), "visgym-hard": (5, 5)}

Position = tuple[int, int]


class MazeError(UserError, ValueError):
    """A maze, size or placement request that is not valid."""


def parse_size(value: str | int | tuple[int, int] | list[int]) -> tuple[int, int]:
    """Size in cells from `visgym-easy`, `8`, `8x6` (rows x cols), or a (rows, cols) pair."""
    if isinstance(value, str):
        key = value.strip().lower()
        if key in SIZE_PRESETS:
            return SIZE_PRESETS[key]
        m = re.fullmatch(r"(\d+)(?:x(\d+))?", key)
        if not m:
            raise MazeError(
                f"unknown maze size {value!r}: use a preset ({', '.join(SIZE_PRESETS)}), "
                "'N' or 'RxC' in cells (e.g. '8x8')"
            )
        rows = int(m.group(1))
        cols = int(m.group(2) or m.group(1))
    elif isinstance(value, int):
        rows = cols = value
    else:
        if len(value) != 2:
            raise MazeError(f"maze size {value!r} must be a (rows, cols) pair in cells")
        rows, cols = int(value[0]), int(value[1])
    for name, n in (("rows", rows), ("cols", cols)):
        if not MIN_CELLS <= n <= MAX_CELLS:
            raise MazeError(f"maze {name} = {n} cells is out of range: allowed {MIN_CELLS}..{MAX_CELLS}")
    return rows, cols


def grid_shape(cells: tuple[int, int]) -> tuple[int, int]:
    return 2 * cells[0] + 1, 2 * cells[1] + 1


def grid_cells(height: int, width: int) -> tuple[int, int]:
    """(rows, cols) in cells of a grid of `height` x `width` squares (the inverse of grid_shape)."""
    return (int(height) - 1) // 2, (int(width) - 1) // 2


def size_name(cells: tuple[int, int]) -> str:
    """'RxC': the one spelling of a size in cells that parse_size reads back."""
    return f"{cells[0]}x{cells[1]}"


@dataclass(frozen=True, eq=False)
class Maze:
    """A maze task. `grid` is an (H, W) uint8 array, H and W odd, outer ring all walls."""

    grid: np.ndarray
    start: Position
    goal: Position
    algorithm: str = "unknown"
    seed: int = 0
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        grid = np.ascontiguousarray(self.grid, dtype=np.uint8)
        object.__setattr__(self, "grid", grid)
        object.__setattr__(self, "start", (int(self.start[0]), int(self.start[1])))
        object.__setattr__(self, "goal", (int(self.goal[0]), int(self.goal[1])))
        validate_grid(grid)
        for name, pos in (("start", self.start), ("goal", self.goal)):
            r, c = pos
            if not (0 <= r < grid.shape[0] and 0 <= c < grid.shape[1]):
                raise MazeError(f"{name} {pos} is outside the {grid.shape[0]}x{grid.shape[1]} grid")
            if grid[r, c] != FLOOR:
                raise MazeError(f"{name} {pos} is on a wall; start and goal must be floor squares")

    @property
    def height(self) -> int:
        return int(self.grid.shape[0])

    @property
    def width(self) -> int:
        return int(self.grid.shape[1])

    @property
    def cells(self) -> tuple[int, int]:
        return grid_cells(self.height, self.width)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Maze):
            return NotImplemented
        return (
            self.start == other.start
            and self.goal == other.goal
            and np.array_equal(self.grid, other.grid)
        )

    def __hash__(self) -> int:
        return hash((self.grid.tobytes(), self.grid.shape, self.start, self.goal))


def validate_grid(grid: np.ndarray) -> None:
    """Raise MazeError unless `grid` is a 2-D 0/1 array with odd sides >= 5 and a closed outer wall."""
    if grid.ndim != 2:
        raise MazeError(f"maze grid must be 2-D, got shape {grid.shape}")
    h, w = grid.shape
    if h % 2 == 0 or w % 2 == 0:
        raise MazeError(f"maze grid is {h}x{w}: height and width must be odd (cells at odd indices)")
    if h < 2 * MIN_CELLS + 1 or w < 2 * MIN_CELLS + 1:
        raise MazeError(f"maze grid is {h}x{w}: the smallest allowed is {2 * MIN_CELLS + 1}x{2 * MIN_CELLS + 1}")
    if grid.size and grid.max() > 1:
        raise MazeError("maze grid values must be 0 (floor) or 1 (wall)")
    if not (grid[0].all() and grid[-1].all() and grid[:, 0].all() and grid[:, -1].all()):
        raise MazeError("maze grid must have a closed outer wall (first/last row and column all 1)")
