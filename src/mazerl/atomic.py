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

from .errors import UserError


class OutsideOutputError(UserError):
    """A name that would put a file outside the command's output directory."""


class InputInsideOutputError(UserError):
    """An input that lies inside the directory a command would replace."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _mode_like_open(path: Path, directory: bool = False) -> None:
    """mkstemp/mkdtemp create 0600/0700 entries; give ours the mode a plain open()/mkdir() would (the
    user's umask), so outputs stay readable by the group and others as the user's other files are."""
    os.chmod(path, (0o777 if directory else 0o666) & ~_umask())


@contextlib.contextmanager
def _naming(target: Path) -> Iterator[None]:
    """An OSError while preparing to write `target` names `target`, not our temporary sibling."""
    try:
        yield
    except OSError as err:
        raise OSError(err.errno, err.strerror or str(err), str(target)) from None


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
    with _naming(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        _mode_like_open(tmp)
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
        raise FileExistsError(f"{target} is not empty; pass --overwrite to replace it")


def inside(path: str | os.PathLike[str], folder: str | os.PathLike[str]) -> bool:
    """Whether `path` is `folder` or lies below it (symbolic links and '..' resolved)."""
    p, f = Path(path).resolve(), Path(folder).resolve()
    return p == f or f in p.parents


def child_path(folder: str | os.PathLike[str], name: str) -> Path:
    """FOLDER/name, refused unless it lies inside FOLDER: nothing is written outside an output directory."""
    target = Path(folder) / name
    if Path(name).is_absolute() or not inside(target, folder) or Path(target).resolve() == Path(folder).resolve():
        raise OutsideOutputError(f"{name!r} would be written outside the output directory {folder}")
    return target


def refuse_inputs_inside(output: str | os.PathLike[str], inputs: dict[str, str | os.PathLike[str] | None]) -> None:
    """An output directory may be replaced (--overwrite); refuse when an input lives inside it, so
    replacing the output can never delete what the command reads."""
    for label, path in inputs.items():
        if path is not None and inside(path, output):
            raise InputInsideOutputError(
                f"{label} {path} lies inside the output directory {output}: writing there could delete it; "
                "choose an output directory that holds none of the inputs")


@contextlib.contextmanager
def atomic_directory(target: str | os.PathLike[str], *, overwrite: bool = False) -> Iterator[Path]:
    """Build a directory in a temporary sibling, then move it into place as a whole.

    `target` may not exist, or exist empty (KFP pre-creates output folders). A non-empty target is
    refused unless `overwrite` is set, in which case it is replaced only after the new one is complete.
    """
    target = Path(target)
    check_output_dir(target, overwrite=overwrite)
    with _naming(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        _mode_like_open(tmp, directory=True)
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
