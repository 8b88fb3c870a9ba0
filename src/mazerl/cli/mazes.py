"""`mazerl mazes ...`: generate, check, show and export maze datasets."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from pydantic import ValidationError
from rich.table import Table

from ..mazes.layout import MazeError
from .common import console, err_console, _fail, _print_rows, _progress


mazes_app = typer.Typer(help="Generate, check and inspect maze datasets.", no_args_is_help=True)


@mazes_app.command("generate")
def mazes_generate(
    out: Annotated[Path, typer.Option("--out", help="output directory (created; must be empty or absent)")],
    config: Annotated[Optional[Path], typer.Option("--config", help="dataset config YAML")] = None,
    preset: Annotated[Optional[str], typer.Option("--preset", help="named config: default | smoke")] = None,
    reference: Annotated[Optional[Path], typer.Option("--reference", help="VisGym-format fixture file for the reference splits")] = None,
    train_seed: Annotated[Optional[int], typer.Option(help="override the config's train_seed")] = None,
    workers: Annotated[int, typer.Option(min=1, help="processes drawing mazes (output does not depend on it)")] = 1,
    overwrite: Annotated[bool, typer.Option(help="replace a non-empty --out")] = False,
) -> None:
    """Write one parquet file per split and DIR/manifest.json."""
    from ..mazes.splits import DatasetConfig, generate_dataset
    from ..mazes.splits import preset as load_preset

    if (config is None) == (preset is None):
        _fail("give exactly one of --config FILE or --preset NAME (default, smoke)")
    from ..atomic import refuse_inputs_inside

    refuse_inputs_inside(out, {"--config": config, "--reference": reference})
    try:
        cfg = DatasetConfig.from_yaml(config) if config else load_preset(preset)  # type: ignore[arg-type]
        if train_seed is not None:  # checked like the config's own train_seed
            cfg = DatasetConfig.model_validate({**cfg.model_dump(), "train_seed": train_seed})
        with _progress() as bar:
            tasks: dict[str, int] = {}

            def progress(split: str, done: int, total: int) -> None:
                if split not in tasks:
                    tasks[split] = bar.add_task(split, total=total)
                bar.update(tasks[split], completed=done)

            manifest = generate_dataset(cfg, out, reference, workers=workers, overwrite=overwrite, progress=progress)
    except ValidationError as err:
        from ..config import format_validation_error

        _fail(format_validation_error(err, str(config or f"--preset {preset}")))
    except (MazeError, FileExistsError) as err:
        _fail(str(err))
    for notice in manifest["notices"]:
        err_console.print(f"[yellow]notice:[/] {notice}")
    _print_manifest(manifest, out)


def _print_manifest(manifest: dict, out: Path) -> None:
    import pandas as pd

    from ..mazes.dataset_io import read_split

    table = Table(title=f"maze splits in {out}")
    table.add_column("split", no_wrap=True)
    table.add_column("rows", justify="right")
    table.add_column("grid")
    table.add_column("algorithms")
    table.add_column("optimal moves\nmin/median/max", no_wrap=True)
    table.add_column("content hash", no_wrap=True)
    for name, info in manifest["splits"].items():
        df: pd.DataFrame = read_split(out / info["file"])
        sizes = ", ".join(sorted({f"{h}x{w}" for h, w in zip(df.height, df.width)}))
        algos = ", ".join(sorted(df.algorithm.unique()))
        opt = df.shortest_path_moves
        table.add_row(name, str(info["rows"]), sizes, algos, f"{opt.min()}/{int(opt.median())}/{opt.max()}",
                      info["content_hash"][:8])
    console.print(table)
    console.print(f"manifest: {out / 'manifest.json'}")


@mazes_app.command("conformance")
def mazes_conformance(
    fixture: Annotated[Path, typer.Argument(help="VisGym maze_2d recording (JSON)")],
) -> None:
    """Replay a VisGym recording through our environment; exit non-zero on any mismatch."""
    from ..envs.conformance import check_fixture

    try:
        results = check_fixture(fixture)
    except MazeError as err:
        _fail(str(err))
    for r in results:
        for m in r.mismatches:
            console.print(f"[red]mismatch[/] {r.env_id} seed {r.seed}: {m}")
    ok = sum(r.ok for r in results)
    steps = sum(r.steps_checked for r in results)
    console.print(f"{steps} steps checked")
    console.print(f"{ok}/{len(results)} episodes match")
    if ok != len(results):
        raise typer.Exit(code=1)


@mazes_app.command("show")
def mazes_show(
    split: Annotated[Path, typer.Argument(help="a split parquet file")],
    index: Annotated[int, typer.Option(help="row number")] = 0,
    png: Annotated[Optional[Path], typer.Option(help="also write the first frame as PNG here")] = None,
) -> None:
    """Print one maze as ASCII (and its analysis); optionally save its first frame."""
    from PIL import Image

    from ..atomic import atomic_path
    from ..mazes.dataset_io import read_split, row_render_options, row_to_maze
    from ..mazes.render import render_ascii, render_rgb

    if png is not None:
        from ..atomic import refuse_inputs_inside

        refuse_inputs_inside(png, {"the split file": split}, choose="choose another --png")
    try:
        df = read_split(split)
    except MazeError as err:
        _fail(str(err))
    if not 0 <= index < len(df):
        _fail(f"--index {index} is out of range: {split} has {len(df)} rows (0..{len(df) - 1})")
    row = df.iloc[index]
    maze = row_to_maze(row)
    console.print(f"[bold]{row['maze_id']}[/]  optimal {row['shortest_path_moves']} moves, "
                  f"max turns {row['max_turns']}, forks on route {row['forks_on_solution']}")
    console.print(render_ascii(maze.grid, maze.start, maze.goal), markup=False, highlight=False)
    if png:
        with atomic_path(png) as tmp:
            Image.fromarray(render_rgb(maze.grid, maze.start, maze.goal, row_render_options(row))).save(tmp, format="PNG")
        console.print(f"wrote {png}")


@mazes_app.command("export")
def mazes_export(
    splits: Annotated[list[Path], typer.Argument(help="split .parquet file(s), or a dataset directory (all its splits)")],
    out: Annotated[Path, typer.Option("--out", help="output directory (created; must be empty or absent)")],
    fmt: Annotated[str, typer.Option("--format", help="what reads the rows: skyrl (SkyRL's dataset rows, "
                                                       "env_class mazerl-maze)")],
    prompt: Annotated[str, typer.Option(help="system prompt in each row: full | short (the tiny model's)")] = "full",
    overwrite: Annotated[bool, typer.Option(help="replace a non-empty --out")] = False,
) -> None:
    """Write the mazes as another framework's dataset rows: one parquet file per split in --out."""
    from ..integrations.export import export_splits

    try:
        written = export_splits(splits, out, fmt, overwrite=overwrite, prompt=prompt)
    except FileExistsError as err:
        _fail(str(err))
    _print_rows(f"{fmt} rows in {out}", [["split", "rows", "file", "from"]] + [
        [w.split, str(w.rows), str(w.file), str(w.source)] for w in written])
