"""Atomic writes: a reader sees the old file, the new file, or no file — never half a file."""

from __future__ import annotations

import contextlib
import errno
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


class SymlinkLoopError(UserError):
    """A path whose symbolic links point back at each other: it names no file at all."""


def resolve_path(path: str | os.PathLike[str]) -> Path:
    """`path` absolute, with symbolic links and '..' resolved; a loop of links is a clear error."""
    try:
        return Path(path).resolve()
    except (RuntimeError, OSError) as err:  # Python < 3.13: RuntimeError("Symlink loop ..."); later: ELOOP
        if isinstance(err, OSError) and err.errno != errno.ELOOP:
            raise
        raise SymlinkLoopError(f"{path} is a loop of symbolic links (it leads back to itself, never to a file); "
                               "give the path of the real file or directory") from None


def inside(path: str | os.PathLike[str], folder: str | os.PathLike[str]) -> bool:
    """Whether `path` is `folder` or lies below it (symbolic links and '..' resolved)."""
    p, f = resolve_path(path), resolve_path(folder)
    return p == f or f in p.parents


def existing_path(name: str | os.PathLike[str] | None) -> Path | None:
    """The path `name` gives when it names something on this machine (a file, a directory, a link),
    else None: a model given as a hub id is no path an output could hold."""
    if name is None:
        return None
    path = Path(name).expanduser()
    return path if os.path.lexists(path) else None


def child_path(folder: str | os.PathLike[str], name: str) -> Path:
    """FOLDER/name, refused unless it lies inside FOLDER: nothing is written outside an output directory."""
    target = Path(folder) / name
    if Path(name).is_absolute() or not inside(target, folder) or resolve_path(target) == resolve_path(folder):
        raise OutsideOutputError(f"{name!r} would be written outside the output directory {folder}")
    return target


def refuse_inputs_inside(output: str | os.PathLike[str], inputs: dict[str, str | os.PathLike[str] | None], *,
                         replaced: list[str | os.PathLike[str]] | None = None, choose: str = "choose another --out") -> None:
    """The one rule that keeps a command from deleting what it reads: no input may lie inside a path
    that the command deletes or replaces. `replaced` lists those paths (default: the whole `output`
    directory, which `--overwrite` replaces); `inputs` maps each input's option or setting name to its
    path (None: not given). Call it before any work starts."""
    targets = [Path(output)] if replaced is None else [Path(p) for p in replaced]
    for label, path in inputs.items():
        if path is None:
            continue
        for target in targets:
            if not inside(path, target):
                continue
            if resolve_path(path) == resolve_path(output) and not Path(output).is_dir():
                raise InputInsideOutputError(f"{label} {path} is also the output {output}: writing the output would "
                                             f"overwrite this input; {choose}")
            part = "" if resolve_path(target) == resolve_path(output) else f" (in {target}, which this command replaces)"
            raise InputInsideOutputError(
                f"{label} {path} lies inside the output directory {output}{part}: writing the output would delete "
                f"this input; {choose}, one that holds none of the inputs")


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
