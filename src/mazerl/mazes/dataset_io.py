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
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ValidationError

from ..atomic import atomic_path, resolve_path
from .layout import MAX_GRID_SIDE, Maze, MazeError
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
RENDER_COLUMNS = ("square_px", "palette", "agent_marker", "goal_marker", "wall_style")


SPLIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_split_name(name: str) -> str:
    """Split names become file names (NAME.parquet): letters, digits, '_', '-', '.', not starting with
    '.' or '-', at most 64 characters; nothing that could point outside the dataset directory."""
    if not isinstance(name, str) or not SPLIT_NAME.fullmatch(name) or ".." in name:
        raise ValueError(f"split name {name!r} is not allowed: use letters, digits, '_', '-' and '.' (not '..'), "
                         "starting with a letter or digit, at most 64 characters")
    return name


def write_split(rows: list[dict], path: str | Path) -> None:
    """Write rows (dicts with every column) to `path` atomically."""
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def read_split(path: str | Path) -> pd.DataFrame:
    """Read and validate a maze table. `maze_id`, `grid`, `start` and `goal` are required; every other
    schema column that is absent is derived (split from the file name, sizes, hashes, shortest path,
    strata, the default turn budget, VisGym drawing), and every one that is present is checked against
    what the maze says. Extra columns are ignored. Any bad row is an error naming the row and the rule."""
    path = Path(path)
    resolve_path(path)  # a loop of symbolic links is named as such, not as a missing file
    if not path.exists():
        raise MazeError(f"split file not found: {path}")
    if path.is_dir():
        raise MazeError(f"{path} is a directory; a split is one .parquet file (e.g. {path / 'heldout.parquet'})")
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowInvalid, OSError) as err:
        raise MazeError(f"{path} is not a readable parquet file: {err}") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in schema.names]
    if missing:
        raise MazeError(f"{path} is missing required column(s): {', '.join(missing)}; a maze table needs at least "
                        f"{', '.join(REQUIRED_COLUMNS)} (the other columns are derived when absent)")
    present = [c for c in COLUMNS if c in schema.names]
    try:
        df = pq.read_table(path, columns=present).to_pandas()
    except (pa.ArrowException, OSError, ValueError) as err:
        raise MazeError(f"{path}: the table cannot be read: {err}") from None
    return _validated(df, path)[list(COLUMNS)]


_STRATA = ("dead_end_cells", "forks_on_solution", "turns_on_solution", "dead_ends_next_to_solution")


def _is_boolean(value) -> bool:
    """True/False (Python's or numpy's): an int subclass that must never pass for a number here."""
    return isinstance(value, (bool, np.bool_))


def whole_number(value, where: str, column: str, low: int, high: int) -> int:
    """An integer cell in [low, high] (floats only when whole), or an error naming the row and column."""
    if _is_boolean(value) or value is None or isinstance(value, (str, bytes)):
        raise MazeError(f"{where}: {column} must be a whole number in {low}..{high}, got {value!r}")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise MazeError(f"{where}: {column} must be a whole number in {low}..{high}, got {value!r}") from None
    if not np.isfinite(f) or f != int(f) or not low <= int(f) <= high:
        raise MazeError(f"{where}: {column} must be a whole number in {low}..{high}, got {value!r}")
    return int(f)


def _validated(df: pd.DataFrame, path: Path) -> pd.DataFrame:
    """Check every row; derive the absent columns and compare the present ones with their derivation."""
    from .hashing import layout_hash, walls_hash
    from .render import VISGYM_RENDER
    from .solver import analyse

    given = set(df.columns)
    ids = df["maze_id"].tolist()
    for i, v in enumerate(ids):
        if not isinstance(v, str) or not v:
            raise MazeError(f"{path} row {i}: maze_id must be a non-empty string, got {v!r}")
    dupes = pd.Series(ids)[pd.Series(ids).duplicated()]
    if len(dupes):
        first = dupes.iloc[0]
        rows = [i for i, v in enumerate(ids) if v == first]
        raise MazeError(f"{path}: maze_id {first!r} appears more than once (rows {', '.join(map(str, rows[:5]))}); "
                        "maze ids must be unique within a split")
    if "split" not in given:
        try:  # the split is named after the file: NAME.parquet
            check_split_name(path.stem)
        except ValueError as err:
            raise MazeError(f"{path}: the file name gives the split its name, and {err}; rename the file, or give "
                            "the table a split column") from None
    render_defaults = VISGYM_RENDER.model_dump()
    derived: dict[str, list] = {c: [] for c in COLUMNS if c not in given}
    defaults = {"split": path.stem, "algorithm": "unknown", "seed": -1, "placement": "given", "source_split": None,
                **render_defaults}
    checked_render: set[tuple] = set()
    for i, row in enumerate(df.itertuples(index=False)):
        rec = row._asdict()
        where = f"{path} row {i} (maze_id {rec['maze_id']!r})"
        maze = row_maze(rec, i, path)
        try:
            a = analyse(maze)
        except MazeError:
            raise MazeError(f"{where}: the goal {maze.goal} cannot be reached from the start {maze.start}") from None
        values = {
            "height": maze.height, "width": maze.width, "shortest_path_moves": a.shortest_path_moves,
            "layout_hash": layout_hash(maze.grid, maze.start, maze.goal), "walls_hash": walls_hash(maze.grid),
            "dead_end_cells": a.dead_end_cells, "forks_on_solution": a.forks_on_solution,
            "turns_on_solution": a.turns_on_solution, "dead_ends_next_to_solution": a.dead_ends_next_to_solution,
        }
        for col, want in values.items():
            if col in given:
                have = rec[col]
                if col.endswith("_hash"):
                    ok = have == want
                else:
                    ok = whole_number(have, where, col, 0, 10**9) == want
                if not ok:
                    raise MazeError(f"{where}: {col} is {have!r} but the maze's grid, start and goal give {want!r}")
        if "max_turns" in given:
            whole_number(rec["max_turns"], where, "max_turns", 1, 100_000)
        else:
            values["max_turns"] = max(2 * a.shortest_path_moves, a.shortest_path_moves + 10)
        if "seed" in given:
            whole_number(rec["seed"], where, "seed", -1, 2**63 - 1)
        for col in ("split", "algorithm", "placement"):
            if col in given and (not isinstance(rec[col], str) or not rec[col]):
                raise MazeError(f"{where}: {col} must be a non-empty string, got {rec[col]!r}")
        if "split" in given:
            try:
                check_split_name(rec["split"])
            except ValueError as err:
                raise MazeError(f"{where}: {err}") from None
        render = tuple(rec.get(c, render_defaults[c]) for c in RENDER_COLUMNS)
        if render not in checked_render:
            try:
                RenderOptions(**dict(zip(RENDER_COLUMNS, (int(render[0]) if _is_whole(render[0]) else render[0], *render[1:]))))
            except ValidationError as err:
                problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
                raise MazeError(f"{where}: drawing options not allowed ({problems})") from None
            checked_render.add(render)
        for col in derived:
            derived[col].append(values[col] if col in values else defaults[col])
    if "split" in given and df["split"].nunique() > 1:
        names = ", ".join(repr(n) for n in sorted(df["split"].unique())[:5])
        raise MazeError(f"{path} holds several splits ({names}): a split file holds one split, so that no evaluation "
                        "mixes their results; write each split to its own file")
    for col, vals in derived.items():
        df[col] = vals
    for col in ("max_turns", "seed", "height", "width", "shortest_path_moves", "square_px", *_STRATA):
        if len(df):
            df[col] = df[col].astype("int64")
    return df


def _is_whole(v) -> bool:
    if _is_boolean(v):
        return False
    try:
        return float(v) == int(float(v))
    except (TypeError, ValueError, OverflowError):
        return False


def row_maze(row: dict, i: int, path: Path) -> Maze:
    """The maze of one table row, or an error naming the row and what is wrong with it."""
    where = f"{path} row {i} (maze_id {row.get('maze_id')!r})"
    raw = row["grid"]
    if raw is None or isinstance(raw, (str, bytes)):
        raise MazeError(f"{where}: grid must be a list of rows of 0/1 integers, got {type(raw).__name__}")
    try:
        rows = [r for r in raw]
        if len(rows) > MAX_GRID_SIDE:
            raise MazeError(f"{where}: grid has {len(rows)} rows; the largest allowed grid is {MAX_GRID_SIDE}x{MAX_GRID_SIDE}")
        rows = [list(r) for r in rows]
    except TypeError:
        raise MazeError(f"{where}: grid must be a list of rows of 0/1 integers") from None
    if any(len(r) > MAX_GRID_SIDE for r in rows):
        raise MazeError(f"{where}: a grid row is longer than {MAX_GRID_SIDE}; the largest allowed grid is "
                        f"{MAX_GRID_SIDE}x{MAX_GRID_SIDE}")
    if len({len(r) for r in rows}) > 1:
        raise MazeError(f"{where}: grid must be rectangular (every row the same length)")
    if any(v is None or _is_boolean(v) or isinstance(v, (str, bytes, float)) and not _is_whole(v) for r in rows for v in r):
        raise MazeError(f"{where}: grid values must be 0 (floor) or 1 (wall); found an empty, True/False or "
                        "non-integer value")
    try:
        grid = np.array(rows)
    except (TypeError, ValueError):
        raise MazeError(f"{where}: grid must be a list of rows of 0/1 integers") from None
    if grid.ndim != 2 or grid.dtype.kind not in "iubf":
        raise MazeError(f"{where}: grid must be a list of rows of 0/1 integers")
    if grid.size and not np.isin(grid, (0, 1)).all():
        bad = grid[~np.isin(grid, (0, 1))].flat[0].item()
        raise MazeError(f"{where}: grid values must be 0 (floor) or 1 (wall); found {bad!r}")
    for name in ("start", "goal"):
        v = row[name]
        try:
            ok = v is not None and not isinstance(v, (str, bytes)) and len(v) == 2 and all(
                x is not None and _is_whole(x) for x in v)
        except TypeError:
            ok = False
        if not ok:
            raise MazeError(f"{where}: {name} must be [row, col] (two whole numbers; True/False are not numbers here), "
                            f"got {v!r}")
    start, goal = tuple(int(x) for x in row["start"]), tuple(int(x) for x in row["goal"])
    if start == goal:
        raise MazeError(f"{where}: start and goal are the same square {start}; they must differ")
    try:
        return Maze(grid=grid.astype(np.uint8), start=start, goal=goal)
    except MazeError as err:
        raise MazeError(f"{where}: {err}") from None


def maze_key(layout_hash: str, start, goal) -> str:
    """One maze whatever its id: its walls (up to symmetry), start and goal. Evaluations count mazes by
    it and comparisons pair them by it."""
    return f"{layout_hash}|{tuple(int(x) for x in start)}|{tuple(int(x) for x in goal)}"


def check_unique_mazes(df: pd.DataFrame, path: str | Path) -> None:
    """Refuse a split that holds one maze under several ids: each copy would be counted as another
    maze, inflating the number of mazes and narrowing every interval computed from it."""
    ids_of: dict[str, list[str]] = {}
    for maze_id, h, start, goal in zip(df.maze_id, df.layout_hash, df.start, df.goal):
        ids_of.setdefault(maze_key(h, start, goal), []).append(str(maze_id))
    repeated = [ids for ids in ids_of.values() if len(ids) > 1]
    if repeated:
        shown = "; ".join(", ".join(repr(i) for i in ids[:4]) for ids in repeated[:3])
        more = f" (and {len(repeated) - 3} more)" if len(repeated) > 3 else ""
        raise MazeError(f"{path} holds the same maze (walls, start and goal) under several ids: {shown}{more}; each copy "
                        "would count as another maze and make every interval too narrow: keep one row per maze")


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
