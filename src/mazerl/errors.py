"""What the command line says when something goes wrong: one line for bad input, one line and a
log file for anything unexpected. Every expected error type derives from `UserError`.

Exit codes (documented in docs/cli.md): 0 success, 1 a check that ran and failed (a conformance
mismatch) or an unexpected internal error, 2 bad input (usage, files, configs, data), 130 interrupted
(Ctrl-C), 143 stopped by SIGTERM (an orchestrator or `kill`; cleaned up like Ctrl-C).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import os
import signal
import tempfile
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM: what a shell or an orchestrator expects of a job it stopped
ERROR_LOG_DIR_ENV = "MAZERL_ERROR_LOG_DIR"


class UserError(Exception):
    """Bad input. Its message names what is wrong and what is allowed; no traceback is shown."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, unwound like Ctrl-C: every atomic writer removes its temporary file or folder on the way out."""


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While the block runs, SIGTERM raises Terminated (in the main thread) instead of ending the process
    at once, which would leave a half-written checkpoint's temporary folder behind."""

    def _terminated(signum, frame):
        raise Terminated()

    try:
        previous = signal.signal(signal.SIGTERM, _terminated)
    except ValueError:  # not the main thread: only the main thread may handle signals
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


_OS_HINTS = {
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "read-only file system",
    errno.ENOSPC: "no space left on the device",
    errno.ENOENT: "no such file or directory",
    errno.ENOTDIR: "a part of the path is not a directory",
    errno.EISDIR: "is a directory, a file was expected",
    errno.EEXIST: "already exists",
    errno.ENAMETOOLONG: "file name too long",
    errno.EDQUOT: "disk quota exceeded",
}


def describe_os_error(err: OSError) -> str:
    """'cannot use PATH: read-only file system' from an OSError (its path and errno)."""
    what = _OS_HINTS.get(err.errno or -1, (err.strerror or str(err)).lower())
    where = err.filename if err.filename is not None else "a file"
    if err.filename2 is not None:
        where = f"{err.filename} -> {err.filename2}"
    return f"cannot use {where}: {what}"


def shorten(text: str, limit: int = 200) -> str:
    """`text` cut to about `limit` characters, saying how long it was: messages stay readable
    whatever a user's input holds."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


MAX_ERRORS_SHOWN = 20  # one bad list can hold 100,000 bad items: the first few say what is wrong
_OWN_MESSAGES = {"missing", "value_error", "assertion_error"}  # errors whose message already says what was given


def format_validation_error(err: ValidationError, source: str) -> str:
    """Every problem of `err` on a line of its own (the first MAX_ERRORS_SHOWN), naming the setting,
    what is wrong and, shortened, the value given."""
    errors = err.errors()
    lines = [f"invalid config {source}:"]
    for e in errors[:MAX_ERRORS_SHOWN]:
        field = shorten(".".join(str(p) for p in e["loc"]) or "(top level)", 120)
        given = e.get("input")
        shown = f" (got {shorten(repr(given), 60)})" if e["type"] not in _OWN_MESSAGES and isinstance(
            given, (str, int, float, bool, type(None))) else ""
        lines.append(f"  {field}: {shorten(e['msg'], 400)}{shown}")
    if len(errors) > MAX_ERRORS_SHOWN:
        lines.append(f"  ... and {len(errors) - MAX_ERRORS_SHOWN:,} more")
    return "\n".join(lines)


def user_message(err: BaseException) -> str | None:
    """The one-line (or few-line) message for an expected error, or None for an unexpected one."""
    from pydantic import ValidationError

    if isinstance(err, UserError):
        return str(err)
    if isinstance(err, ValidationError):
        return format_validation_error(err, "(input)")
    if isinstance(err, UnicodeDecodeError):
        return f"a file is not UTF-8 text ({err.reason} at byte {err.start}); save it as UTF-8"
    if isinstance(err, MemoryError):
        return "out of memory: the input is larger than this machine can hold; use fewer or smaller mazes"
    if isinstance(err, OSError):
        return describe_os_error(err)
    return None


def error_log_dir() -> Path:
    return Path(os.environ.get(ERROR_LOG_DIR_ENV) or Path(tempfile.gettempdir()) / "mazerl-errors")


def write_error_log(err: BaseException, argv: list[str]) -> Path | None:
    """Save the traceback of an unexpected error; None when even that is impossible."""
    try:
        folder = error_log_dir()
        folder.mkdir(parents=True, exist_ok=True)
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        path = folder / f"mazerl-{stamp}-{os.getpid()}.log"
        text = "command: " + " ".join(argv) + "\n\n" + "".join(traceback.format_exception(err))
        path.write_text(text, encoding="utf-8")
        return path
    except OSError:
        return None
