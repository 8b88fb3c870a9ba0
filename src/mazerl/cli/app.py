"""The top of the `mazerl` command line: its one error boundary and its global options."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import click
import typer
from typer.core import TyperGroup

from ..errors import (EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated, sigterm_as_interrupt,
                     user_message, write_error_log)
from .common import _escape, err_console


DEBUG_ENV = "MAZERL_DEBUG"


# What click and typer report themselves (usage errors with the usage line, --help, exits): typer
# 0.2x carries its own copy of click, whose errors derive from typer.TyperException, not click's.
_PASS_THROUGH = tuple({click.exceptions.Exit, click.ClickException, click.exceptions.Abort, typer.Exit,
                       getattr(typer, "Abort", click.exceptions.Abort),
                       getattr(typer, "TyperException", click.ClickException)})


class _ErrorBoundary(TyperGroup):
    """The command line's one error boundary. Bad input (any `UserError`, a validation error, an
    unreadable or unwritable file): one message, exit 2. Anything unexpected: one line naming the
    error and a log file holding the traceback, exit 1. `--debug` (or MAZERL_DEBUG=1) also prints
    the traceback. Nobody sees a raw traceback otherwise. Ctrl-C, and SIGTERM alike, unwind (temporary
    files removed) to one line: exit 130, or 143 for SIGTERM."""

    def invoke(self, ctx: click.Context):
        try:
            with sigterm_as_interrupt():
                return super().invoke(ctx)
        except _PASS_THROUGH:
            raise
        except Terminated:
            err_console.print("[bold red]interrupted[/] (SIGTERM)", highlight=False)
            raise typer.Exit(code=EXIT_TERMINATED) from None
        except KeyboardInterrupt:
            err_console.print("[bold red]interrupted[/]", highlight=False)
            raise typer.Exit(code=EXIT_INTERRUPTED) from None
        except Exception as err:  # noqa: BLE001 - this is the boundary
            debug = bool(os.environ.get(DEBUG_ENV))
            if debug:
                err_console.print_exception(show_locals=False)
            message = user_message(err)
            if message is not None:
                err_console.print("[bold red]error:[/] " + _escape(message), soft_wrap=True, highlight=False)
                raise typer.Exit(code=EXIT_BAD_INPUT) from None
            log = write_error_log(err, sys.argv)
            where = f"; traceback in {log}" if log else ""
            err_console.print("[bold red]internal error:[/] " + _escape(f"{type(err).__name__}: {err}{where} "
                              "(rerun with --debug to print it; please report it)"), soft_wrap=True, highlight=False)
            raise typer.Exit(code=EXIT_FAILED) from None


app = typer.Typer(help="mazerl: multi-turn GRPO for vision-language models on mazes.", no_args_is_help=True,
                  cls=_ErrorBoundary, pretty_exceptions_enable=False)


@app.callback()
def _main_options(
    debug: Annotated[bool, typer.Option("--debug", help="print the traceback of any error (also: MAZERL_DEBUG=1)")] = False,
) -> None:
    """mazerl: multi-turn GRPO for vision-language models on mazes.

    Exit codes: 0 success; 1 a check failed or an internal error (its traceback is saved to a log
    file that the message names); 2 bad input; 130 interrupted; 143 stopped by SIGTERM.
    """
    if debug:
        os.environ[DEBUG_ENV] = "1"
