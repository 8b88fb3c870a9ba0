"""Maze tables written for other RL frameworks' data loaders (`mazerl mazes export`).

Format `skyrl`: the rows a SkyRL run reads. One parquet file per split, each row one maze: `prompt` (the chat
messages before the first frame: mazerl's system prompt), `env_class` (`mazerl-maze`, the skyrl-gym environment
that `mazerl.integrations.skyrl` registers) and every column of the maze table (mazes.dataset_io), so the
environment rebuilds the maze, its turn budget and its drawing from the row alone, and the exported file is
still a maze table that `read_split` accepts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ..atomic import atomic_directory, child_path, inside, refuse_inputs_inside
from ..mazes.dataset_io import COLUMNS, SCHEMA, read_split, records
from ..mazes.layout import MazeError

FORMATS: tuple[str, ...] = ("skyrl",)
# The name SkyRL runs give as `environment.env_class`; skyrl-gym's registry knows it once
# mazerl.integrations.skyrl is imported. Defined here so that exporting needs no skyrl-gym.
SKYRL_ENV_CLASS = "mazerl-maze"
SKYRL_SCHEMA = pa.schema([
    ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
    ("env_class", pa.string()),
    *SCHEMA,
])


class ExportError(MazeError):
    """An export request that cannot be carried out as given."""


@dataclass(frozen=True)
class ExportedSplit:
    split: str
    source: Path
    file: Path
    rows: int


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r}: allowed {', '.join(FORMATS)}")
    return fmt


def skyrl_prompt(prompt: str = "full") -> list[dict]:
    """The chat messages before the first frame: mazerl's system prompt, as a policy's `prompt` setting names
    it: `full` (the default) or `short` (the tiny CPU model's). The environment's `init` appends the frame."""
    from ..policy.prompts import PROMPTS

    if prompt not in PROMPTS:
        raise ExportError(f"unknown prompt {prompt!r}: allowed {', '.join(PROMPTS)}")
    return [{"role": "system", "content": PROMPTS[prompt]}]


def split_files(inputs: list[str | Path]) -> list[Path]:
    """The split files named by `inputs`: parquet files as given; a dataset directory (`mazes generate` output)
    stands for every split its manifest lists, the frozen evaluation and VisGym reference splits included (a
    directory without a manifest: every .parquet file in it)."""
    from ..mazes.splits import read_manifest

    if not inputs:
        raise ExportError("nothing to export: give one or more split .parquet files, or a dataset directory")
    files: list[Path] = []
    for given in inputs:
        path = Path(given)
        if not path.exists():
            raise ExportError(f"{path} does not exist: give a split .parquet file or a dataset directory")
        if not path.is_dir():
            files.append(path)
            continue
        manifest = read_manifest(path)
        if manifest is not None:
            entries = manifest.get("splits")
            if not isinstance(entries, dict) or not all(isinstance(e, dict) and isinstance(e.get("file"), str)
                                                        for e in entries.values()):
                raise ExportError(f"{path / 'manifest.json'} lists no split files: generate the dataset again")
            found = [_listed_file(path, e["file"]) for e in entries.values()]
        else:
            found = sorted(p for p in path.glob("*.parquet") if p.is_file())
        if not found:
            raise ExportError(f"{path} holds no split files (*.parquet): give split files or a dataset directory")
        files += found
    return files


def _listed_file(data_dir: Path, name: str) -> Path:
    """A split file a manifest lists, refused when its name leads out of the dataset directory."""
    if Path(name).is_absolute() or not inside(data_dir / name, data_dir):
        raise ExportError(f"{data_dir / 'manifest.json'} lists the split file {name!r}, which lies outside {data_dir}; "
                          "a dataset's split files lie in its directory: generate the dataset again")
    return data_dir / name


def export_splits(inputs: list[str | Path], out_dir: str | Path, fmt: str, *, overwrite: bool = False,
                  prompt: str = "full") -> list[ExportedSplit]:
    """Export every split in `inputs` (files or dataset directories) to `out_dir/<split>.parquet`.

    Every input is read and checked before anything is written, and `out_dir` appears complete or not at all
    (it must be empty or absent unless `overwrite`); no input may lie inside it, so nothing read is deleted."""
    check_format(fmt)
    messages = skyrl_prompt(prompt)
    files = split_files(inputs)
    for path in files:
        refuse_inputs_inside(out_dir, {"split file": path})
    tables: dict[str, tuple[Path, list[dict]]] = {}
    for path in files:
        df = read_split(path)
        names = sorted(set(df["split"]))
        # read_split allows one split per file; an empty table is named after its file
        name = names[0] if names else path.stem
        if name in tables:
            raise ExportError(f"split {name!r} is given twice ({tables[name][0]} and {path}): each split is "
                              "exported to its own file, <split>.parquet; give each split once")
        rows = [{"prompt": messages, "env_class": SKYRL_ENV_CLASS, **{c: r[c] for c in COLUMNS}} for r in records(df)]
        tables[name] = (path, rows)
    written = []
    with atomic_directory(out_dir, overwrite=overwrite) as tmp:
        for name, (source, rows) in tables.items():
            target = child_path(tmp, f"{name}.parquet")
            pq.write_table(pa.Table.from_pylist(rows, schema=SKYRL_SCHEMA), target, compression="zstd")
            written.append(ExportedSplit(name, source, Path(out_dir) / target.name, len(rows)))
    return written
