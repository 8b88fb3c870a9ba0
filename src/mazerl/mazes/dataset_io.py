"""The maze table: one parquet file per split, a fixed schema every later step reads.

Columns (one row per maze task):
  maze_id str, split str, height/width int (grid squares, odd), grid list<list<int8>> (1 = wall),
  start/goal list<int16> ([row, col]), shortest_path_moves int, layout_hash str (walls + start +
  goal, up to the 8 symmetries), walls_hash str (walls alone), algorithm str, seed int, placement str,
  max_turns int (the split's turn budget), dead_end_cells, forks_on_solution, turns_on_solution,
  dead_ends_next_to_solution (ints: difficulty strata), and the render options square_px, palette,
  agent_marker, goal_marker, wall_style; source_split (str or null: where a redrawn layout came from).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..atomic import atomic_path
from .layout import Maze, MazeError
from .render import RenderOptions

SCHEMA = pa.schema(
    [
        ("maze_id", pa.string()),
        ("split", pa.string()),
        ("height", pa.int16()),
        ("width", pa.int16()),
        ("grid", pa.list_(pa.list_(pa.int8()))),
        ("start", pa.list_(pa.int16())),
        ("goal", pa.list_(pa.int16())),
        ("shortest_path_moves", pa.int32()),
        ("layout_hash", pa.string()),
        ("walls_hash", pa.string()),
        ("algorithm", pa.string()),
        ("seed", pa.int64()),
        ("placement", pa.string()),
        ("max_turns", pa.int32()),
        ("dead_end_cells", pa.int32()),
        ("forks_on_solution", pa.int32()),
        ("turns_on_solution", pa.int32()),
        ("dead_ends_next_to_solution", pa.int32()),
        ("square_px", pa.int16()),
        ("palette", pa.string()),
        ("agent_marker", pa.string()),
        ("goal_marker", pa.string()),
        ("wall_style", pa.string()),
        ("source_split", pa.string()),
    ]
)
COLUMNS: tuple[str, ...] = tuple(SCHEMA.names)
# A user's own maze table needs only these; read_split derives the other columns from them.
REQUIRED_COLUMNS = ("maze_id", "grid", "start", "goal")
MAX_GRID_SIDE = 255  # 127x127 cells: the largest maze a table may hold
RENDER_COLUMNS = ("square_px", "palette", "agent_marker", "goal_marker", "wall_style")


def write_split(rows: list[dict], path: str | Path) -> None:
    """Write rows (dicts with every column) to `path` atomically."""
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def read_split(path: str | Path) -> pd.DataFrame:
    """Read a maze table. `maze_id`, `grid`, `start` and `goal` are required; any other schema column
    that is absent is derived (split from the file name, sizes, hashes, shortest path, strata, the
    default turn budget, VisGym drawing); extra columns are ignored."""
    path = Path(path)
    if not path.exists():
        raise MazeError(f"split file not found: {path}")
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowInvalid, OSError) as err:
        raise MazeError(f"{path} is not a readable parquet file: {err}") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in schema.names]
    if missing:
        raise MazeError(f"{path} is missing required column(s): {', '.join(missing)}; a maze table needs at least "
                        f"{', '.join(REQUIRED_COLUMNS)} (the other columns are derived when absent)")
    present = [c for c in COLUMNS if c in schema.names]
    df = pq.read_table(path, columns=present).to_pandas()
    if len(present) < len(COLUMNS):
        df = _derive_columns(df, path)
    return df[list(COLUMNS)]


def _derive_columns(df: pd.DataFrame, path: Path) -> pd.DataFrame:
    """Fill every absent schema column from maze_id, grid, start and goal (each row checked)."""
    from .hashing import layout_hash, walls_hash
    from .render import VISGYM_RENDER
    from .solver import analyse

    derived: dict[str, list] = {c: [] for c in COLUMNS if c not in df.columns}
    defaults = {"split": path.stem, "algorithm": "unknown", "seed": -1, "placement": "given", "source_split": None,
                **VISGYM_RENDER.model_dump()}
    for i, row in enumerate(df.itertuples(index=False)):
        maze = _row_maze(row._asdict(), i, path)
        try:
            a = analyse(maze)
        except MazeError:
            raise MazeError(f"{path} row {i} (maze_id {row.maze_id!r}): the goal {maze.goal} cannot be reached "
                            f"from the start {maze.start}") from None
        values = {
            "height": maze.height, "width": maze.width, "shortest_path_moves": a.shortest_path_moves,
            "layout_hash": layout_hash(maze.grid, maze.start, maze.goal), "walls_hash": walls_hash(maze.grid),
            "max_turns": max(2 * a.shortest_path_moves, a.shortest_path_moves + 10),
            "dead_end_cells": a.dead_end_cells, "forks_on_solution": a.forks_on_solution,
            "turns_on_solution": a.turns_on_solution, "dead_ends_next_to_solution": a.dead_ends_next_to_solution,
        }
        for col in derived:
            derived[col].append(values[col] if col in values else defaults[col])
    for col, vals in derived.items():
        df[col] = vals
    return df


def _row_maze(row: dict, i: int, path: Path) -> Maze:
    """The maze of one table row, or an error naming the row and what is wrong with it."""
    where = f"{path} row {i} (maze_id {row.get('maze_id')!r})"
    try:
        rows = [list(r) for r in row["grid"]]
    except TypeError:
        raise MazeError(f"{where}: grid must be a list of rows of 0/1 values") from None
    if len({len(r) for r in rows}) > 1:
        raise MazeError(f"{where}: grid must be rectangular (every row the same length)")
    try:
        grid = np.array(rows)
    except (TypeError, ValueError):
        raise MazeError(f"{where}: grid must be a list of rows of 0/1 values") from None
    if grid.ndim != 2 or grid.dtype == object:
        raise MazeError(f"{where}: grid must be a list of rows of 0/1 values")
    if grid.shape[0] > MAX_GRID_SIDE or grid.shape[1] > MAX_GRID_SIDE:
        raise MazeError(f"{where}: grid is {grid.shape[0]}x{grid.shape[1]}; the largest allowed is {MAX_GRID_SIDE}x{MAX_GRID_SIDE}")
    if grid.size and not np.isin(grid, (0, 1)).all():
        raise MazeError(f"{where}: grid values must be 0 (floor) or 1 (wall)")
    for name in ("start", "goal"):
        v = row[name]
        if v is None or len(v) != 2:
            raise MazeError(f"{where}: {name} must be [row, col]")
    start, goal = tuple(int(x) for x in row["start"]), tuple(int(x) for x in row["goal"])
    if start == goal:
        raise MazeError(f"{where}: start and goal are the same square {start}")
    try:
        return Maze(grid=grid.astype(np.uint8), start=start, goal=goal)
    except MazeError as err:
        raise MazeError(f"{where}: {err}") from None


def row_to_maze(row) -> Maze:
    grid = np.array([list(r) for r in row["grid"]], dtype=np.uint8)
    return Maze(grid=grid, start=tuple(row["start"]), goal=tuple(row["goal"]), algorithm=row["algorithm"], seed=int(row["seed"]))


def row_render_options(row) -> RenderOptions:
    return RenderOptions(**{c: (int(row[c]) if c == "square_px" else row[c]) for c in RENDER_COLUMNS})


def content_hash(rows: list[dict]) -> str:
    """SHA-256 over the rows' canonical JSON: independent of parquet encoder versions."""
    h = hashlib.sha256()
    for row in rows:
        h.update(json.dumps(row, sort_keys=True, separators=(",", ":"), default=_jsonable).encode())
        h.update(b"\n")
    return h.hexdigest()


def records(df: pd.DataFrame) -> list[dict]:
    """A split's rows as plain Python dicts (lists, ints, None), ready to modify and write back."""
    return [{k: _jsonable(v) for k, v in rec.items()} for rec in df.to_dict("records")]


def table_content_hash(df: pd.DataFrame) -> str:
    """The same hash, recomputed from a split read back from disk."""
    return content_hash(records(df))


def _jsonable(v):
    if isinstance(v, np.ndarray):
        return [_jsonable(x) for x in v.tolist()]
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return None
    return v
