"""File manifests: the sha256 of every file of a folder, and the one check that a folder holds exactly
the files its manifest lists. Every manifest kind goes through it: training checkpoints
(`manifest.json`, rl/checkpoint.py and distributed/checkpoint.py), models and checkpoints on S3
(storage.py), and the shipped tiny-base (`provenance.json`, policy/loading.py).

A manifest is a JSON object whose `files` maps each file's path (relative, '/'-separated) to its
sha256 in lowercase hex. It vouches for a folder only when the folder holds exactly those files with
those hashes: an empty or misshapen `files` vouches for nothing, and a file it does not list (say,
planted weights) is refused like a missing one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath

from .errors import UserError

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
SHAPE = "'files' must be a mapping of each file's relative path to its sha256 (64 lowercase hex digits)"


class ManifestError(UserError):
    """A manifest that cannot be read or is misshapen, or a folder that does not match its manifest."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def hash_files(folder: Path, rels: list[str] | tuple[str, ...]) -> dict[str, str]:
    """The sha256 of each of the files `rels` under `folder`, several files at once: hashlib releases the
    GIL while it hashes, so threads use as many cores (and parallel reads) as there are files."""
    rels = sorted(rels)
    workers = min(len(rels), os.cpu_count() or 1, 8)
    if workers <= 1:
        return {rel: sha256_file(folder / rel) for rel in rels}
    with ThreadPoolExecutor(workers, thread_name_prefix="sha256") as pool:
        return dict(zip(rels, pool.map(lambda rel: sha256_file(folder / rel), rels)))


def folder_files(folder: Path, manifest_name: str) -> list[str]:
    """Every file under `folder` as a relative '/' path, except the manifest itself (it cannot list its own hash)."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_file() and p.relative_to(folder).as_posix() != manifest_name)


def manifest_of(folder: Path, manifest_name: str) -> dict[str, str]:
    """The `files` mapping for `folder` as it is now: what a writer records, last, beside the files."""
    return hash_files(folder, folder_files(folder, manifest_name))


def parse_manifest(raw: bytes, where: str) -> dict[str, str]:
    """The `files` mapping of a manifest's bytes, its shape checked; `where` names the manifest in errors."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ManifestError(f"{where} is not UTF-8 text (byte {err.start}): it is not a manifest") from None
    except ValueError as err:
        raise ManifestError(f"{where} is not valid JSON ({err}): it is not a manifest") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{where} must hold a JSON object with 'files'; {SHAPE}")
    return check_file_list(data.get("files"), where)


def read_manifest(path: Path) -> dict[str, str]:
    """The `files` mapping of the manifest file at `path`, its shape checked."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ManifestError(f"cannot read {path}: {err.strerror or err}") from None
    return parse_manifest(raw, str(path))


def check_file_list(files: object, where: str) -> dict[str, str]:
    """`files` itself when it is a non-empty mapping of safe relative paths to sha256 digests."""
    if not isinstance(files, dict):
        got = "missing" if files is None else f"a {type(files).__name__}"
        raise ManifestError(f"{where}: {SHAPE}; here it is {got}")
    if not files:
        raise ManifestError(f"{where}: 'files' is empty, so it vouches for nothing; {SHAPE}")
    for rel, digest in files.items():
        if not _safe_relative(rel):
            raise ManifestError(f"{where} lists {rel!r}: not a relative path inside its folder; {SHAPE}")
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise ManifestError(f"{where} gives {rel!r} the hash {digest!r}; {SHAPE}")
    return files


def _safe_relative(rel: str) -> bool:
    """A canonical relative '/' path that stays inside its folder: no '..', no absolute path, no empty part."""
    if not rel:
        return False
    path = PurePosixPath(rel)
    return path.as_posix() == rel and not path.is_absolute() and ".." not in path.parts and rel != "."


def check_folder(folder: Path, files: dict[str, str], where: str, manifest_name: str) -> None:
    """Raise ManifestError unless `folder` holds exactly the `files` listed in the manifest `where`, each
    with its sha256."""
    check_listing(folder, files, where, manifest_name)
    actual = hash_files(folder, list(files))
    for rel in sorted(files):
        if actual[rel] != files[rel]:
            raise ManifestError(f"{rel} does not match its hash (the sha256 in {where})")


def check_listing(folder: Path, files: dict[str, str], where: str, manifest_name: str) -> None:
    """The part of check_folder that reads no file: `folder` holds exactly the files listed in `where`.
    For a folder whose hashes one process has already checked (or its writer has just computed)."""
    present = set(folder_files(folder, manifest_name))
    missing = sorted(set(files) - present)
    if missing:
        raise ManifestError(f"{_some(missing)} {'is' if len(missing) == 1 else 'are'} missing from {folder} "
                            f"(listed in {where})")
    unlisted = sorted(present - set(files))
    if unlisted:
        raise ManifestError(f"{folder} holds {_some(unlisted)}, not listed in {where}: a manifest lists exactly "
                            "the files of its folder")


def verify_folder(folder: Path, manifest_name: str) -> dict[str, str]:
    """Read `folder`'s manifest and check the folder against it; returns the listed files."""
    manifest = folder / manifest_name
    files = read_manifest(manifest)
    check_folder(folder, files, str(manifest), manifest_name)
    return files


def _some(names: list[str], shown: int = 5) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


MANIFEST = "manifest.json"  # a training checkpoint's and an uploaded model's manifest


def verify(path: Path, hashes_checked: bool = False) -> str | None:
    """None if the checkpoint at `path` is complete and intact (exactly the files its manifest lists,
    each with its sha256), else what is wrong. `hashes_checked`: the files' sha256 were checked already
    (by whoever just wrote or verified them): only that the folder holds exactly the listed files."""
    if not (path / MANIFEST).exists():
        return "no manifest (incomplete write)"
    try:
        if hashes_checked:
            check_listing(path, read_manifest(path / MANIFEST), str(path / MANIFEST), MANIFEST)
        else:
            verify_folder(path, MANIFEST)
    except ManifestError as err:
        return str(err)
    return None
