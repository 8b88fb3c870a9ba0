"""Per-task logs of a local (kfp.local) pipeline run.

kfp.local streams every task's output through this process's stdout, one task after another,
between "Executing task '<name>'" and "Task '<name>' finished with status ...". We tee that stream
to a file while the run lasts, then cut it into `<run dir>/<task>/task.log`, so a failed run can
say which task failed and where its log is, and every finished task keeps its log beside its outputs.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from .atomic import write_text

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_START = re.compile(r"Executing task '([^']+)'")
_FAILED = re.compile(r"Inner task failed: '([^']+)'")


class _Tee:
    """A text stream that writes to the terminal and to a log file."""

    def __init__(self, terminal: TextIO, log: TextIO):
        self._terminal, self._log = terminal, log

    def write(self, text: str) -> int:
        self._log.write(text)
        return self._terminal.write(text)

    def flush(self) -> None:
        self._log.flush()
        self._terminal.flush()

    def __getattr__(self, name):  # isatty, encoding, fileno, ...: the terminal's
        return getattr(self._terminal, name)


@contextlib.contextmanager
def tee_stdout(log_path: Path) -> Iterator[Path]:
    """Copy everything printed to stdout (kfp.local's task output included) into `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w", encoding="utf-8") as log:
        terminal = sys.stdout
        sys.stdout = _Tee(terminal, log)  # type: ignore[assignment]
        try:
            yield log_path
        finally:
            sys.stdout = terminal


def split_task_logs(log_path: Path, run_dir: Path) -> dict[str, Path]:
    """Write each task's lines to `<run_dir>/<task>/task.log`; returns task -> log path."""
    segments: dict[str, list[str]] = {}
    current: str | None = None
    for raw in log_path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True):
        line = _ANSI.sub("", raw)
        started = _START.search(line)
        if started:
            current = started.group(1)
            segments.setdefault(current, [])
        if current is not None:
            segments[current].append(line)
    written = {}
    for task, lines in segments.items():
        target = run_dir / task / "task.log"
        write_text(target, "".join(lines))
        written[task] = target
    return written


def failed_task(message: str) -> str | None:
    """The innermost failed task named in kfp.local's "Inner task failed: ..." error."""
    found = _FAILED.search(_ANSI.sub("", message))
    return found.group(1) if found else None


def tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(encoding="utf-8", errors="replace").rstrip().splitlines()
    return "\n".join(text[-lines:])
