"""Per-step metrics to a JSONL file and TensorBoard event files."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from .errors import UserError


class MetricsWriter:
    """Appends one JSON object per line (flushed and fsynced). On resume, lines after the resumed
    step and a torn last line are dropped, so the file always describes one consistent run."""

    def __init__(self, path: str | Path, tensorboard_dir: str | Path | None = None, resume_step: int | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None and self.path.exists():
            kept = [r for r in read_metrics(self.path) if r.get("step", -1) <= resume_step]
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
            os.replace(tmp, self.path)
        elif resume_step is None and self.path.exists() and self.path.stat().st_size:
            # Callers start a fresh run only into an empty or explicitly overwritten directory.
            raise FileExistsError(f"{self.path} holds an earlier run's metrics; refusing to replace them")
        self._fh = open(self.path, "a")
        self._tb = None
        if tensorboard_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(tensorboard_dir))

    def write(self, record: dict) -> None:
        # strict JSON: a non-finite number is written as null (json.dumps would write NaN/Infinity)
        record = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        self._fh.write(json.dumps(record, sort_keys=True, allow_nan=False) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        if self._tb is not None:
            step = int(record.get("step", 0))
            for k, v in record.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step" and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)
            self._tb.flush()

    def close(self) -> None:
        self._fh.close()
        if self._tb is not None:
            self._tb.close()


class MetricsFileError(UserError, ValueError):
    """A metrics file damaged somewhere other than its last line."""


def read_metrics(path: str | Path) -> list[dict]:
    """Every record. Only a torn last line (a crash mid-write) is tolerated and dropped; damage
    anywhere else is an error, since silently skipping records would misreport the run."""
    lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    out = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                continue
            raise MetricsFileError(f"{path}: line {number} is not a JSON record (only a torn last line is tolerated)") from None
        if not isinstance(record, dict):
            raise MetricsFileError(f"{path}: line {number} is not a JSON object")
        out.append(record)
    return out
