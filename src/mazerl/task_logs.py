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
from .progress import PREFIX

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_START = re.compile(r"Executing task '([^']+)'")
_FAILED = re.compile(r"Inner task failed: '([^']+)'")


_FINISHED = re.compile(r"Task '([^']+)' finished with status (\w+)")
_PIPELINE = re.compile(r"Pipeline '([^']+)' finished with status (\w+)")


def console_line(line: str) -> str | None:
    """What the console shows of one line of a local run's output (None: the log only).

    Task starts and ends, and the tasks' own progress lines; kfp.local's executor input/output
    JSON and the libraries' chatter stay in the logs."""
    plain = _ANSI.sub("", line).rstrip("\n")
    if m := _START.search(plain):
        return f"> {m.group(1)}"
    if m := _FINISHED.search(plain):
        return f"{'ok' if m.group(2) == 'SUCCESS' else m.group(2)}: {m.group(1)}"
    if m := _PIPELINE.search(plain):
        return f"pipeline {m.group(1)}: {m.group(2)}"
    at = plain.find(PREFIX)
    if at >= 0:
        return "  " + plain[at + len(PREFIX):].strip()
    return None


class _Tee:
    """A text stream that writes everything to a log file and, to the terminal, what `show` keeps
    of each complete line (everything when `show` is None)."""

    def __init__(self, terminal: TextIO, log: TextIO, show=None):
        self._terminal, self._log, self._show = terminal, log, show
        self._partial = ""

    def write(self, text: str) -> int:
        self._log.write(text)
        if self._show is None:
            return self._terminal.write(text)
        self._partial += text
        *lines, self._partial = self._partial.split("\n")
        for line in lines:
            shown = self._show(line)
            if shown is not None:
                self._terminal.write(shown + "\n")
                self._terminal.flush()
        return len(text)

    def flush(self) -> None:
        self._log.flush()
        self._terminal.flush()

    def __getattr__(self, name):  # isatty, encoding, fileno, ...: the terminal's
        return getattr(self._terminal, name)


@contextlib.contextmanager
def tee_stdout(log_path: Path, show=console_line) -> Iterator[Path]:
    """Copy everything printed to stdout (kfp.local's task output included) into `log_path`; the
    terminal gets what `show` keeps of each line (None: everything)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w", encoding="utf-8") as log:
        terminal = sys.stdout
        sys.stdout = _Tee(terminal, log, show)  # type: ignore[assignment]
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


_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?([A-Z]\w*(?:Error|Exception|Exit|Interrupt)): (.*)$")


def task_error(path: Path) -> str | None:
    """The exception a failed task ended with ("ConfigError: config file not found: ..."), from its log."""
    found = None
    for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
        m = _EXCEPTION.match(_ANSI.sub("", raw).strip())
        if m:
            found = f"{m.group(1)}: {m.group(2)}"
    return found


def tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(encoding="utf-8", errors="replace").rstrip().splitlines()
    return "\n".join(text[-lines:])
