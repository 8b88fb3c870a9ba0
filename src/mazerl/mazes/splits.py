"""Frozen dataset splits: the first pipeline step.

Evaluation splits are drawn from `eval_seed` and never change when the training pool does; the
`train` split is drawn last from `train_seed` (a scheduled retraining run passes a fresh one),
excluding every evaluation layout. No layout appears in two splits, except a split that is
declared `derived_from` another (visual-shift: the same layouts drawn differently).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Annotated, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .. import __version__
from ..atomic import atomic_directory, check_output_dir, child_path, refuse_inputs_inside, write_json
from ..config import Seed, TurnBudget
from .dataset_io import check_split_name, check_unique_mazes, content_hash, write_split
from .generators import GENERATORS
from .hashing import layout_hash, walls_hash
from .layout import Maze, MazeError, grid_cells, parse_size, size_name
from .render import RenderOptions
from .sampling import sample_maze
from .seeding import derive_seed
from .solver import analyse, solve
from .visgym import VISGYM_MAX_TURNS, load_visgym_fixture

TRAIN_SPLIT = "train"
MANIFEST = "manifest.json"
FORMAT = "mazerl.mazes/v1"

Size = Annotated[tuple[int, int], Field(description="(rows, cols) in cells")]


MazeCount = Annotated[int, Field(ge=1, le=1_000_000)]


class SplitSpec(BaseModel):
    """One split. `count` mazes are drawn for every (size, algorithm) combination; a count per size
    ({'4x4': 2000, '5x5': 222}) weights a pool toward some sizes."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    count: MazeCount | dict[str, MazeCount] = Field(
        description="mazes per (size, algorithm), for every size or per size (a mapping must name every size)"
    )
    sizes: list[Size] = Field(default_factory=lambda: [(4, 4)])
    algorithms: list[str] = Field(default_factory=lambda: ["wilson"])
    placement: Literal["visgym-corners", "random", "dead-ends"] = "visgym-corners"
    min_moves: int = Field(1, ge=1)
    max_turns: TurnBudget | dict[str, TurnBudget] | None = Field(
        None, description="turn budget, for every size or per size ({'4x4': 18}: a size it does not name gets the "
        "default); mazes it cannot solve (optimal + stop > budget) are not drawn; default max(2*optimal, optimal+10)"
    )
    render: list[RenderOptions] = Field(default_factory=lambda: [RenderOptions()], min_length=1)
    derived_from: str | None = Field(None, description="redraw layouts sampled from this split")

    @field_validator("sizes", mode="before")
    @classmethod
    def _sizes(cls, v):
        if not isinstance(v, list) or not v:
            raise ValueError("sizes must be a non-empty list, e.g. ['visgym-easy', '8x8', [5, 6]]")
        try:
            return [parse_size(s) for s in v]
        except MazeError as err:
            raise ValueError(str(err)) from None

    @field_validator("max_turns", "count", mode="before")
    @classmethod
    def _per_size(cls, v, info):
        if isinstance(v, dict):  # keys as 'RxC', whatever form of size was given
            try:
                return {size_name(parse_size(k)): n for k, n in v.items()}
            except MazeError as err:
                raise ValueError(f"{info.field_name} names a size it cannot read: {err}") from None
        return v

    @field_validator("max_turns", mode="after")
    @classmethod
    def _budget_at_least_two(cls, v):
        for n in (v.values() if isinstance(v, dict) else [v] if v is not None else []):
            if n < 2:
                raise ValueError(f"a turn budget of {n} leaves no turn for a move and the stop: give 2 or more")
        return v

    def budget(self, cells: tuple[int, int]) -> int | None:
        """The turn budget of this split's mazes of `cells` (rows, cols), or None for the default rule."""
        if isinstance(self.max_turns, dict):
            return self.max_turns.get(size_name(cells))
        return self.max_turns

    def count_of(self, cells: tuple[int, int]) -> int:
        """How many mazes of `cells` (rows, cols) this split draws for each of its algorithms."""
        return self.count[size_name(cells)] if isinstance(self.count, dict) else self.count

    def total(self) -> int:
        """How many mazes the split holds (a derived split: `count` layouts of its source)."""
        if self.derived_from is not None:
            return self.count_of(self.sizes[0])
        return sum(self.count_of(cells) for cells in self.sizes) * len(self.algorithms)

    @model_validator(mode="after")
    def _budget_sizes(self):
        named = {size_name(cells) for cells in self.sizes}
        if isinstance(self.max_turns, dict):
            extra = sorted(set(self.max_turns) - named)
            if extra:
                raise ValueError(f"max_turns gives a budget for {', '.join(extra)}, which is not among the split's sizes "
                                 f"({', '.join(sorted(named))})")
        if isinstance(self.count, dict):
            extra, missing = sorted(set(self.count) - named), sorted(named - set(self.count))
            if extra or missing:
                raise ValueError(f"count per size must name exactly the split's sizes ({', '.join(sorted(named))}): "
                                 + "; ".join(([f"{', '.join(extra)} not among them"] if extra else [])
                                             + ([f"no count for {', '.join(missing)}"] if missing else [])))
            if self.derived_from is not None:
                raise ValueError(f"a derived split draws `count` layouts of {self.derived_from!r}, whatever their size: "
                                 "give one number")
        return self

    @model_validator(mode="after")
    def _min_moves_possible(self):
        if self.min_moves > 1 and self.placement == "visgym-corners":
            raise ValueError(f"min_moves = {self.min_moves} has no effect with placement 'visgym-corners' (start and goal "
                             "are fixed corners): use placement 'random' or 'dead-ends', or leave min_moves at 1")
        longest = min(2 * (r * c - 1) for r, c in self.sizes)  # a route through every cell of the smallest size
        if self.min_moves > longest:
            smallest = min(self.sizes, key=lambda s: s[0] * s[1])
            raise ValueError(f"min_moves = {self.min_moves} is impossible in a {size_name(smallest)}-cell maze "
                             f"(at most {longest} moves apart)")
        return self

    @field_validator("algorithms")
    @classmethod
    def _algorithms(cls, v: list[str]):
        bad = [a for a in v if a not in GENERATORS]
        if bad or not v:
            raise ValueError(f"unknown algorithm(s) {bad or v}: allowed {', '.join(sorted(GENERATORS))}")
        return v


class DatasetConfig(BaseModel):
    """Which splits to write and how. Validated at load; errors name the field."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    eval_seed: Seed = Field(0, description="seeds every evaluation split (kept fixed across runs)")
    train_seed: Seed = Field(0, description="seeds the train split (new per retraining run)")
    dedup: Literal["walls", "layout"] = Field(
        "walls", description="'walls': same walls up to symmetry = same layout (strict); 'layout': walls+start+goal"
    )
    reference_splits: dict[str, str] = Field(
        default_factory=lambda: {"visgym-easy": "maze_2d/easy", "visgym-hard": "maze_2d/hard"},
        description="base name -> VisGym env_id, imported from the --reference file; the split is named after its "
        "real size, BASE-N for N mazes (the shipped recording gives visgym-easy-64 and visgym-hard-64)",
    )
    splits: dict[str, SplitSpec]
    attempts_per_maze: int = Field(30, ge=1, le=10_000, description="give up after count*this draws without enough unique layouts")

    @model_validator(mode="after")
    def _check(self):
        for name, spec in self.splits.items():
            if name in self.reference_splits:
                raise ValueError(f"split {name!r} is both generated and imported from the reference file")
            if spec.derived_from is not None:
                if spec.derived_from not in self.splits or spec.derived_from == name:
                    raise ValueError(f"splits.{name}.derived_from = {spec.derived_from!r}: must name another split")
                if self.splits[spec.derived_from].derived_from is not None:
                    raise ValueError(f"splits.{name}.derived_from: {spec.derived_from!r} is itself derived")
                if name == TRAIN_SPLIT or spec.derived_from == TRAIN_SPLIT:
                    raise ValueError("the train split cannot take part in derived_from")
        return self

    @field_validator("splits", "reference_splits")
    @classmethod
    def _names(cls, v: dict):
        for name in v:
            check_split_name(name)
        return v

    @field_validator("reference_splits")
    @classmethod
    def _base_names(cls, v: dict):
        for name in v:
            if re.search(r"-\d+$", name):
                raise ValueError(f"reference split {name!r} ends in a count: give its base name "
                                 f"({re.sub(r'-[0-9]+$', '', name)!r}); the split is named after the mazes the "
                                 "reference file really holds (BASE-N)")
        return v

    @classmethod
    def from_yaml(cls, path: str | Path) -> "DatasetConfig":
        from ..config import ConfigError, format_validation_error, load_yaml_file

        data = load_yaml_file(path, "dataset config") or {}
        if not isinstance(data, dict):
            raise ConfigError(f"dataset config {path} must hold a mapping of settings, got {type(data).__name__}")
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise ConfigError(format_validation_error(err, str(path))) from None


def _visual_variants() -> list[RenderOptions]:
    return [
        RenderOptions(palette="inverted"),
        RenderOptions(palette="swapped"),
        RenderOptions(palette="dark", agent_marker="diamond"),
        RenderOptions(square_px=32, agent_marker="square", goal_marker="disc"),
        RenderOptions(square_px=20, goal_marker="ring"),
        RenderOptions(wall_style="thin"),
    ]


def preset(name: str) -> DatasetConfig:
    """Named configurations: `default` (the full evaluation suite) and `smoke` (tests, seconds)."""
    big = name == "default"
    if name not in ("default", "smoke"):
        raise MazeError(f"unknown dataset preset {name!r}: allowed default, smoke")
    n = (lambda full, small: full if big else small)
    return DatasetConfig(
        splits={
            "heldout": SplitSpec(count=n(1000, 128), max_turns=VISGYM_MAX_TURNS),
            "larger": SplitSpec(count=n(200, 32), sizes=["5x5", "6x6", "8x8"]),
            "algorithm-shift": SplitSpec(count=n(150, 32), algorithms=["dfs", "kruskal", "prim", "braided"], max_turns=VISGYM_MAX_TURNS),
            "visual-shift": SplitSpec(count=n(300, 64), derived_from="heldout", render=_visual_variants(), max_turns=VISGYM_MAX_TURNS),
            TRAIN_SPLIT: SplitSpec(count=n(4000, 256), max_turns=VISGYM_MAX_TURNS),
        }
    )


def default_turn_budget(optimal: int) -> int:
    """Enough turns to solve with slack: max(2 x optimal, optimal + 10)."""
    return max(2 * optimal, optimal + 10)


def _row(maze_id: str, split: str, maze: Maze, placement: str, max_turns: int | None, render: RenderOptions,
         source_split: str | None = None, hashes: tuple[str, str] | None = None) -> dict:
    a = analyse(maze)
    lh, wh = hashes or (layout_hash(maze.grid, maze.start, maze.goal), walls_hash(maze.grid))
    return {
        "maze_id": maze_id,
        "split": split,
        "height": maze.height,
        "width": maze.width,
        "grid": maze.grid.tolist(),
        "start": list(maze.start),
        "goal": list(maze.goal),
        "shortest_path_moves": a.shortest_path_moves,
        "layout_hash": lh,
        "walls_hash": wh,
        "algorithm": maze.algorithm,
        "seed": int(maze.seed),
        "placement": placement,
        "max_turns": int(max_turns if max_turns is not None else default_turn_budget(a.shortest_path_moves)),
        "dead_end_cells": a.dead_end_cells,
        "forks_on_solution": a.forks_on_solution,
        "turns_on_solution": a.turns_on_solution,
        "dead_ends_next_to_solution": a.dead_ends_next_to_solution,
        **render.model_dump(),
        "source_split": source_split,
    }


def _candidate(args: tuple) -> tuple[int, Maze, str, str, int]:
    """Draw the maze at one index (runs in worker processes)."""
    index, seed, algorithm, cells, placement, min_moves = args
    maze = sample_maze(algorithm, cells, seed, placement, min_moves)
    optimal = len(solve(maze.grid, maze.start, maze.goal))
    return index, maze, layout_hash(maze.grid, maze.start, maze.goal), walls_hash(maze.grid), optimal


class _Drawer:
    """Draws candidates in index order, in chunks, optionally on worker processes.

    The accepted mazes depend only on the seeds and the order of indices, never on `workers`.
    """

    def __init__(self, workers: int):
        self.pool = ProcessPoolExecutor(max_workers=workers) if workers > 1 else None
        self.chunk = 256 if workers > 1 else 1

    def draw(self, argses):
        if self.pool is None:
            for a in argses:
                yield _candidate(a)
            return
        batch = []
        for a in argses:
            batch.append(a)
            if len(batch) == self.chunk:
                yield from self.pool.map(_candidate, batch, chunksize=32)
                batch = []
        if batch:
            yield from self.pool.map(_candidate, batch, chunksize=32)

    def close(self):
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)


def _generate_split(name: str, spec: SplitSpec, base_seed: int, seen: set[str], key: int, drawer: _Drawer,
                    attempts_per_maze: int, progress: Callable[[int], None]) -> list[dict]:
    rows: list[dict] = []
    for cells in spec.sizes:
        size = size_name(cells)
        budget = spec.budget(cells)
        for algorithm in spec.algorithms:
            accepted = 0
            wanted = spec.count_of(cells)
            limit = wanted * attempts_per_maze
            argses = (
                (i, derive_seed(base_seed, name, size, algorithm, i), algorithm, cells, spec.placement, spec.min_moves)
                for i in range(limit)
            )
            tried = too_long = 0
            for index, maze, lh, wh, optimal in drawer.draw(argses):
                tried += 1
                ident = (wh, lh)[key]
                if ident in seen:
                    continue
                if budget is not None and optimal + 1 > budget:
                    too_long += 1  # unsolvable within the split's turn budget (optimal moves + stop)
                    continue
                seen.add(ident)
                render = spec.render[accepted % len(spec.render)]
                maze_id = f"{name}-{size}-{algorithm}-{index:06d}"
                rows.append(_row(maze_id, name, maze, spec.placement, budget, render, hashes=(lh, wh)))
                accepted += 1
                progress(1)
                if accepted == wanted:
                    break
            if accepted < wanted:
                raise MazeError(
                    f"split {name!r} ({size}, {algorithm}): found only {accepted} unique layouts of "
                    f"{wanted} requested after {tried} draws ({too_long} needed more than max_turns = "
                    f"{budget} turns; the other splits hold {len(seen) - accepted} layouts); "
                    "lower the count, raise max_turns, use a larger size, or set dedup: layout"
                )
    return rows


def _derive_split(name: str, spec: SplitSpec, source_rows: list[dict], base_seed: int) -> list[dict]:
    wanted = spec.total()
    if wanted > len(source_rows):
        raise MazeError(f"split {name!r} wants {wanted} layouts from {spec.derived_from!r}, which has {len(source_rows)}")
    rng = random.Random(derive_seed(base_seed, name, "sample"))
    picked = sorted(rng.sample(range(len(source_rows)), wanted))
    rows = []
    for k, i in enumerate(picked):
        src = dict(source_rows[i])
        render = spec.render[k % len(spec.render)]
        src.update(render.model_dump())
        src["maze_id"] = f"{name}-{k:06d}"
        src["split"] = name
        src["source_split"] = spec.derived_from
        budget = spec.budget(grid_cells(src["height"], src["width"]))
        if budget is not None:
            src["max_turns"] = budget
        rows.append(src)
    return rows


def reference_split_name(base: str, mazes: int) -> str:
    """A reference split is named after its real size: BASE-N (visgym-easy-64 for the shipped recording)."""
    name = f"{base}-{mazes}"
    try:
        return check_split_name(name)
    except ValueError as err:
        raise MazeError(f"reference split {base!r} with {mazes} mazes: {err}") from None


def _reference_rows(base: str, env_id: str, path: Path, episodes) -> tuple[str, list[dict]]:
    chosen = sorted((e for e in episodes if e.env_id == env_id), key=lambda e: e.seed)
    if not chosen:
        raise MazeError(f"reference file {path} has no episodes of {env_id!r} for split {base!r}")
    name = reference_split_name(base, len(chosen))
    rows = []
    for ep in chosen:
        maze_id = f"{name}-seed{ep.seed:03d}"
        # The reference run's 18-turn limit was set for `easy`; other levels get the default budget
        # (VisGym's hard mazes need up to 32 moves).
        budget = VISGYM_MAX_TURNS if ep.env_id == "maze_2d/easy" else None
        rows.append(_row(maze_id, name, ep.maze, "visgym-corners", budget, RenderOptions()))
    # two seeds that drew the same maze would count it twice in every evaluation of the split
    check_unique_mazes(pd.DataFrame(rows), f"reference file {path} ({env_id})")
    return name, rows


def generate_dataset(
    config: DatasetConfig,
    out_dir: str | Path,
    reference: str | Path | None = None,
    *,
    workers: int = 1,
    overwrite: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict:
    """Write every split to `out_dir/<split>.parquet` plus `out_dir/manifest.json`; return the manifest.

    The directory appears complete or not at all. `progress(split, done, total)` is called as mazes are accepted.
    """
    check_output_dir(out_dir, overwrite=overwrite)
    refuse_inputs_inside(out_dir, {"--reference": reference})
    key = 0 if config.dedup == "walls" else 1
    seen: set[str] = set()
    results: dict[str, list[dict]] = {}
    notices: list[str] = []
    reference_info = None

    def tick(split: str, total: int):
        done = [0]

        def inner(n: int):
            done[0] += n
            if progress:
                progress(split, done[0], total)

        return inner

    if reference is not None:
        reference = Path(reference)
        episodes = load_visgym_fixture(reference)
        imported: dict[str, str] = {}
        for base, env_id in config.reference_splits.items():
            name, rows = _reference_rows(base, env_id, reference, episodes)
            if name in config.splits:
                raise MazeError(f"split {name!r} is both generated and imported from the reference file {reference}; "
                                "rename the generated split")
            for r in rows:  # reserved: nothing generated may repeat a reference maze
                seen.add((r["walls_hash"], r["layout_hash"])[key])
            results[name] = rows
            imported[name] = env_id
            tick(name, len(rows))(len(rows))
        reference_info = {"path": str(reference), "file_sha256": _sha256_file(reference), "splits": imported}
    elif config.reference_splits:
        notices.append(
            f"no --reference file given: reference split(s) {', '.join(config.reference_splits)} left out"
        )

    order = [n for n, s in config.splits.items() if s.derived_from is None and n != TRAIN_SPLIT]
    order += [n for n, s in config.splits.items() if s.derived_from is not None]
    order += [TRAIN_SPLIT] if TRAIN_SPLIT in config.splits else []
    drawer = _Drawer(workers)
    try:
        for name in order:
            spec = config.splits[name]
            total = spec.total()
            if spec.derived_from is not None:
                results[name] = _derive_split(name, spec, results[spec.derived_from], config.eval_seed)
                tick(name, total)(total)
            else:
                base = config.train_seed if name == TRAIN_SPLIT else config.eval_seed
                results[name] = _generate_split(
                    name, spec, base, seen, key, drawer, config.attempts_per_maze, tick(name, total)
                )
    finally:
        drawer.close()

    manifest = {
        "format": FORMAT,
        "library_version": __version__,
        "config": config.model_dump(mode="json"),
        "eval_seed": config.eval_seed,
        "train_seed": config.train_seed,
        "reference": reference_info,
        "notices": notices,
        "splits": {},
    }
    with atomic_directory(out_dir, overwrite=overwrite) as tmp:
        for name, rows in results.items():
            write_split(rows, child_path(tmp, f"{name}.parquet"))
            manifest["splits"][name] = {
                "file": f"{name}.parquet",
                "rows": len(rows),
                "content_hash": content_hash(rows),
                "role": "train" if name == TRAIN_SPLIT else "eval",
            }
        manifest["eval_splits_hash"] = content_hash(
            [{"split": n, "hash": m["content_hash"]} for n, m in sorted(manifest["splits"].items()) if m["role"] == "eval"]
        )
        write_json(tmp / MANIFEST, manifest)  # last: a directory with a manifest is complete
    return manifest


def read_manifest(data_dir: str | Path) -> dict | None:
    """A dataset's manifest.json (None when the directory has none); a damaged one is an error naming it."""
    path = Path(data_dir) / MANIFEST
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise MazeError(f"{path} is not UTF-8 text (byte {err.start}); the dataset manifest is damaged: "
                        "generate the dataset again") from None
    except ValueError as err:  # json.JSONDecodeError
        raise MazeError(f"{path} is not valid JSON ({err}); the dataset manifest is damaged: generate the dataset again") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("config", {}), dict) or not isinstance(
            manifest.get("reference") or {}, dict):
        raise MazeError(f"{path} is not a dataset manifest (a JSON object with config and splits): generate the dataset again")
    return manifest


def reference_splits(manifest: dict | None) -> set[str]:
    """The names of a dataset's VisGym reference splits, as its manifest records them."""
    if not manifest:
        return set()
    recorded = (manifest.get("reference") or {}).get("splits")
    if isinstance(recorded, dict):
        return set(recorded)
    # manifests written before reference splits were named after their size: the config's names
    names = manifest.get("config", {}).get("reference_splits") or {}
    return set(names) if isinstance(names, dict) else set()


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
