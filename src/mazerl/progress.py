"""One-line progress reports from long steps (training, evaluation, generation), for people and logs.

A step reports `update(done, figures)` as it goes; a background thread prints the latest state at
least every `interval` seconds, so a reader never waits long for a sign of life even when one unit
of work is slow:

    [mazerl] train-grpo  step 12/40  reward 0.41  success 0.38  parse 0.000  02:31 elapsed  ETA 05:50

Lines start with PREFIX, which is how a local pipeline run picks them out of its tasks' output for
the console (everything else goes to the task logs only). Printed with flush: a task's stdout is a
pipe, and a buffered line would arrive late.
"""

from __future__ import annotations

import threading
import time

PREFIX = "[mazerl]"


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def _figure(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.1e}"
    return str(value)


class Progress:
    """`with Progress("train-grpo", total=40, unit="step") as p: p.update(k, reward=0.4)`."""

    def __init__(self, task: str, total: int | None, unit: str = "", interval: float = 10.0, printer=print,
                 deadline_s: float | None = None):
        """`deadline_s`: the step stops after this many seconds at the latest (a time budget), which caps the ETA."""
        self.task, self.total, self.unit, self.interval = task, total, unit, interval
        self.deadline_s = deadline_s
        self._print = printer
        self._done = 0
        self._fraction: float | None = None
        self._figures: dict = {}
        self._started = time.monotonic()
        self._last_line = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._heartbeat, daemon=True)

    def __enter__(self) -> "Progress":
        self._emit()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)
        if exc[0] is None:
            self._emit(final=True)

    def update(self, done: int, progress: float | None = None, total: int | None = None, **figures) -> None:
        """`done` units so far; `progress` (0-1), when given, is the share of the work done, for the
        ETA (e.g. evaluation: mazes still playing count by the turns they have used); `total`, when
        given, is a new estimate of the units in all (GRPO's schedule fitted to its deadline)."""
        with self._lock:
            if total is not None:
                self.total = total
            self._done = done
            self._fraction = progress
            self._figures.update(figures)
        if time.monotonic() - self._last_line >= self.interval:
            self._emit()

    def line(self, final: bool = False) -> str:
        with self._lock:
            done, figures, fraction = self._done, dict(self._figures), self._fraction
        elapsed = time.monotonic() - self._started
        count = f"{self.unit} {done}/{self.total}" if self.total else f"{self.unit} {done}"
        parts = [PREFIX, self.task, count.strip()]
        parts += [f"{k} {_figure(v)}" for k, v in figures.items() if v is not None]
        parts.append(f"{_clock(elapsed)} elapsed")
        if final:
            parts.append("done")
        elif fraction is not None and fraction > 0:
            parts.append(f"ETA {_clock(elapsed / fraction * (1 - fraction))}")
        elif self.total and done > 0:
            eta = elapsed / done * (self.total - done)
            if self.deadline_s is not None:
                eta = min(eta, max(0.0, self.deadline_s - elapsed))
            parts.append(f"ETA {_clock(eta)}")
        return "  ".join(parts)

    def _emit(self, final: bool = False) -> None:
        self._last_line = time.monotonic()
        self._print(self.line(final), flush=True)

    def _heartbeat(self) -> None:
        while not self._stop.wait(min(1.0, self.interval / 2)):
            if time.monotonic() - self._last_line >= self.interval:
                self._emit()
