"""Atomic writes: a reader sees the old file, the new file, or no file — never half a file."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _fsync_dir(path: Path) -> None:
    # Make the rename itself durable; some filesystems (or platforms) do not support it.
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside `target`; on success rename it over `target`.

    On an exception the temporary file is removed and `target` is left untouched.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, target)
        _fsync_dir(target.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes(target: str | os.PathLike[str], data: bytes) -> None:
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)


def write_text(target: str | os.PathLike[str], text: str) -> None:
    write_bytes(target, text.encode("utf-8"))


def write_json(target: str | os.PathLike[str], obj: Any) -> None:
    write_text(target, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def check_output_dir(target: str | os.PathLike[str], *, overwrite: bool = False) -> None:
    """Fail early (before any work) if `target` cannot take a new output directory."""
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise FileExistsError(f"{target} exists and is not a directory")
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        raise FileExistsError(f"{target} is not empty; pass overwrite=True (--overwrite) to replace it")


@contextlib.contextmanager
def atomic_directory(target: str | os.PathLike[str], *, overwrite: bool = False) -> Iterator[Path]:
    """Build a directory in a temporary sibling, then move it into place as a whole.

    `target` may not exist, or exist empty (KFP pre-creates output folders). A non-empty target is
    refused unless `overwrite` is set, in which case it is replaced only after the new one is complete.
    """
    target = Path(target)
    check_output_dir(target, overwrite=overwrite)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield tmp
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
            os.replace(target, old / "d")
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
        _fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
