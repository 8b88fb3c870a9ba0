"""What every command group shares: the consoles, progress bars, tables, and turning a library error into one message."""

from __future__ import annotations

import os
import sys

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..errors import EXIT_BAD_INPUT
from ..mazes.layout import MazeError


# Piped into a log (CI, `make demo | tee`), rich would cut tables to 80 columns; give them room.
_WIDTH = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 160
console = Console(width=_WIDTH)
err_console = Console(stderr=True, width=_WIDTH)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _quiet_hf() -> None:
    """Our own progress bars speak for the long steps; silence transformers' per-file bars."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _fail(message: str) -> None:
    err_console.print("[bold red]error:[/] " + _escape(message), soft_wrap=True, highlight=False)
    raise typer.Exit(code=EXIT_BAD_INPUT)


def _print_rows(title: str, rows: list[list[str]]) -> None:
    """A rich table from a header row and data rows (nothing for no rows)."""
    if not rows:
        return
    table = Table(title=title)
    for col in rows[0]:
        table.add_column(col, no_wrap=col == "split")
    for r in rows[1:]:
        table.add_row(*r)
    console.print(table)


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err_console, transient=False,
    )


def _train_progress(total: int, keys: tuple[str, ...]):
    bar = _progress()
    task = bar.add_task("training", total=total)

    def on_step(step: int, record: dict) -> None:
        shown = "  ".join(f"{k.split('/')[-1]} {record[k]:.3g}" for k in keys if k in record)
        bar.update(task, completed=step, description=f"step {step}  {shown}")

    return bar, on_step


def _run_job(fn):
    from ..policy.loading import PolicyLoadError

    try:
        return fn()
    except (PolicyLoadError, MazeError, FileExistsError) as err:
        _fail(str(err))


def _load_profile(name: str):
    from ..config import ConfigError
    from ..profiles import load_profile

    try:
        return load_profile(name)
    except ConfigError as err:
        _fail(str(err))


def _cluster_profile(name: str, runnable: bool = False):
    """A cluster profile; `runnable`: also one whose training backend this version has."""
    from ..config import ConfigError
    from ..workflow import check_backend

    prof = _load_profile(name)
    if prof.kind == "local":
        _fail(f"profile {prof.name!r} runs here with `mazerl pipeline run`; submit a cluster profile "
              f"({', '.join(p for p in _profile_names() if p != prof.name)})")
    if runnable:
        try:
            check_backend(prof.backend)
        except ConfigError as err:
            _fail(f"profile {prof.name!r}: {err}")
    return prof


def _profile_names() -> list[str]:
    from ..profiles import available_profiles

    return available_profiles()


def _pipeline_modules():
    """The KFP adapter (mazerl.pipelines): imported only by pipeline commands, as it needs kfp."""
    try:
        from ..pipelines import run as pipeline_run
    except ImportError as err:
        _fail(f"the pipeline commands need kfp: pip install 'mazerl[kfp]' ({err})")
    return pipeline_run
