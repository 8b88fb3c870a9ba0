"""Run data on S3: checkpoints mirrored from the trainer's local (or FSx) folder, and small JSON files.

A storage address is a local path (`/fsx/mazerl/...` included) or `s3://bucket/prefix`. On S3 a
checkpoint is the objects under `<uri>/step-XXXXXXXX/` and exists only once its `manifest.json`
(the sha256 of every file) is there: files go up first (multipart, botocore retrying with backoff),
the manifest last, so a crash mid-upload leaves nothing a reader would trust; pruning deletes the
manifest first for the same reason. Credentials come only from the environment (IRSA on the
cluster, `AWS_*` variables elsewhere); an endpoint override, e.g. a local S3, from boto3's own
`AWS_ENDPOINT_URL_S3`. Nothing here writes a credential anywhere.
"""

from __future__ import annotations

import json
import logging
import re
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from .atomic import atomic_directory
from .errors import UserError
from .integrity import MANIFEST, check_file_list, check_folder, manifest_of, parse_manifest, verify
from .profiles import check_bucket_name

log = logging.getLogger(__name__)
_STEP = re.compile(r"step-([0-9]{8})")  # fullmatch: a name with anything after the digits is not a checkpoint


class StorageError(UserError):
    """An address that is not usable, or an object store that refused; the message says which."""


def is_s3(address: str) -> bool:
    return str(address).startswith("s3://")


def join_address(root: str, *parts: str) -> str:
    """A path under a registry root: a local (or FSx) path or an s3:// prefix."""
    return "/".join([root.rstrip("/"), *parts]) if root.startswith("s3://") else str(Path(root, *parts))


def split_s3(uri: str) -> tuple[str, str]:
    """`s3://bucket/a/b` -> ("bucket", "a/b"), the bucket name checked."""
    if not is_s3(uri):
        raise StorageError(f"{uri!r} is not an s3:// address")
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    try:
        check_bucket_name(bucket)
    except ValueError as err:
        raise StorageError(f"{uri!r}: {err}") from None
    return bucket, prefix.strip("/")


def s3_client(max_attempts: int = 10):
    """boto3's S3 client with adaptive retries (exponential backoff on throttling, 5xx, dropped connections);
    `AWS_MAX_ATTEMPTS`, when set, decides the number of attempts instead (botocore reads it)."""
    import os

    import boto3
    from botocore.config import Config

    retries = {"mode": "adaptive"} if os.environ.get("AWS_MAX_ATTEMPTS") else {"max_attempts": max_attempts, "mode": "adaptive"}
    return boto3.client("s3", config=Config(retries=retries))


def s3_failure(err: Exception, what: str, address: str) -> StorageError:
    """One message for a failed S3 call: what was asked, of which address, and what to set or check."""
    from boto3.exceptions import S3TransferFailedError, S3UploadFailedError
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError, PartialCredentialsError

    if isinstance(err, (NoCredentialsError, PartialCredentialsError)):
        return StorageError(f"could not {what} {address}: no AWS credentials found ({err}); set AWS_ACCESS_KEY_ID and "
                            "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or run where a role provides them (IRSA on the cluster)")
    if isinstance(err, EndpointConnectionError):
        endpoint = err.kwargs.get("endpoint_url", "the S3 endpoint")
        return StorageError(f"could not {what} {address}: cannot connect to {endpoint}; check AWS_ENDPOINT_URL "
                            "(or AWS_ENDPOINT_URL_S3) and AWS_DEFAULT_REGION, and that the object store is reachable from here")
    if isinstance(err, ClientError):
        code = err.response.get("Error", {}).get("Code", "?")
        return StorageError(f"S3 refused to {what} {address} ({code}: {err.response.get('Error', {}).get('Message', '')})")
    if isinstance(err, (S3UploadFailedError, S3TransferFailedError)):  # upload_file/download_file wrap the cause
        return StorageError(f"could not {what} {address}: {str(err).split(': ', 1)[-1]}")
    return StorageError(f"could not {what} {address}: {err}")


def _transfer_config(part_bytes: int):
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(multipart_threshold=part_bytes, multipart_chunksize=part_bytes, max_concurrency=8)


class S3CheckpointStore:
    """Checkpoints under an s3:// prefix, mirrored from local checkpoint folders (rl/checkpoint.py layout)."""

    # 64 MiB parts: a 16 GB shard of the 8B model is 256 parts (S3 allows 10,000; the minimum is 5 MiB)
    def __init__(self, uri: str, keep_last: int = 3, client=None, part_bytes: int = 64 * 2**20):
        if part_bytes < 5 * 2**20:
            raise StorageError(f"part_bytes = {part_bytes}: S3 multipart parts are at least 5 MiB")
        self.part_bytes = part_bytes
        if keep_last < 1:
            raise StorageError(f"keep_last = {keep_last}: must be >= 1")
        self.uri = uri.rstrip("/")
        self.bucket, self.prefix = split_s3(uri)
        self.keep_last = keep_last
        self.client = client or s3_client()

    def _key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def _call(self, what: str, fn, *args, **kwargs):
        from boto3.exceptions import S3TransferFailedError, S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(*args, **kwargs)
        except (S3UploadFailedError, S3TransferFailedError, ClientError, BotoCoreError) as err:
            raise s3_failure(err, what, f"in {self.uri}") from None

    # ---- upload --------------------------------------------------------------------------------------
    def upload(self, checkpoint: Path, name: str | None = None, just_written: bool = False) -> str:
        """Upload a complete local checkpoint as `name` (default: its folder name); its manifest object
        goes last. A folder without a manifest (a model directory) gets one computed here. Returns
        its s3:// address. `just_written`: the caller has just written the checkpoint, its manifest
        hashed from the files as written, so they are not read twice more (a full check here, then the
        upload): only the file list is checked; a download checks every hash (`download`)."""
        checkpoint = Path(checkpoint)
        name = name or checkpoint.name
        if (checkpoint / MANIFEST).exists():
            problem = verify(checkpoint, hashes_checked=just_written)
            if problem is not None:
                raise StorageError(f"not uploading {checkpoint}: {problem}")
            manifest = json.loads((checkpoint / MANIFEST).read_text())
        else:
            manifest = {"files": check_file_list(manifest_of(checkpoint, MANIFEST), f"the files of {checkpoint}")}
        for rel in sorted(manifest["files"]):
            self._call(f"upload {rel}", self.client.upload_file, str(checkpoint / rel), self.bucket,
                       self._key(name, rel), Config=_transfer_config(self.part_bytes))
        self._call("write the manifest", self.client.put_object, Bucket=self.bucket, Key=self._key(name, MANIFEST),
                   Body=json.dumps(manifest, sort_keys=True).encode(), ContentType="application/json")
        return f"s3://{self.bucket}/{self._key(name)}"

    # ---- what exists ---------------------------------------------------------------------------------
    def _step_prefixes(self) -> list[tuple[int, str]]:
        paginator = self.client.get_paginator("list_objects_v2")
        base = self._key() + "/" if self.prefix else ""
        found = []
        pages = self._call("list checkpoints", lambda: list(paginator.paginate(Bucket=self.bucket, Prefix=base, Delimiter="/")))
        for page in pages:
            for cp in page.get("CommonPrefixes", []):
                name = cp["Prefix"][len(base):].strip("/")
                m = _STEP.fullmatch(name)
                if m:
                    found.append((int(m.group(1)), name))
        return sorted(found)

    def _has_manifest(self, name: str) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(name, MANIFEST))
            return True
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise s3_failure(err, "read", f"{self.uri}/{name}/{MANIFEST}") from None
        except BotoCoreError as err:
            raise s3_failure(err, "read", f"{self.uri}/{name}/{MANIFEST}") from None

    def complete(self) -> list[tuple[int, str]]:
        """(step, folder name) of every checkpoint whose manifest is there, oldest first."""
        return [(s, n) for s, n in self._step_prefixes() if self._has_manifest(n)]

    def latest(self) -> str | None:
        done = self.complete()
        return done[-1][1] if done else None

    # ---- download ------------------------------------------------------------------------------------
    def download(self, name: str, target: Path) -> Path:
        """Fetch checkpoint `name` into `target` (atomically): exactly the files its manifest lists, each
        checked against its sha256 there (integrity.py), or nothing."""
        address = f"{self.uri}/{name}/{MANIFEST}"
        body = self._call(f"read {name}'s manifest", self.client.get_object, Bucket=self.bucket, Key=self._key(name, MANIFEST))
        raw = self._call(f"read {name}'s manifest", body["Body"].read)
        files = parse_manifest(raw, address)  # a non-empty mapping of paths inside the folder, or an error
        with atomic_directory(Path(target), overwrite=True) as tmp:
            for rel in sorted(files):
                dest = tmp / rel
                if not dest.resolve().is_relative_to(tmp.resolve()):  # e.g. through a symbolic link
                    raise StorageError(f"{address} names {rel!r}, outside the checkpoint: refusing it")
                dest.parent.mkdir(parents=True, exist_ok=True)
                self._call(f"download {rel}", self.client.download_file, self.bucket, self._key(name, rel), str(dest),
                           Config=_transfer_config(self.part_bytes))
            check_folder(tmp, files, address, MANIFEST)
            (tmp / MANIFEST).write_bytes(raw)
        return Path(target)

    # ---- prune ---------------------------------------------------------------------------------------
    def prune(self) -> list[str]:
        """Keep the newest `keep_last` complete checkpoints; older ones (and incomplete uploads older than
        the newest complete one) are deleted, manifest first."""
        done = self.complete()
        keep = {n for _, n in done[-self.keep_last:]}
        newest = done[-1][0] if done else -1
        removed = []
        for step, name in self._step_prefixes():
            if name in keep or step > newest:  # a newer incomplete one may be uploading right now
                continue
            self._delete_prefix(name)
            removed.append(name)
        return removed

    def _delete_prefix(self, name: str) -> None:
        self._call("delete a manifest", self.client.delete_object, Bucket=self.bucket, Key=self._key(name, MANIFEST))
        paginator = self.client.get_paginator("list_objects_v2")
        for page in self._call("list objects", lambda: list(paginator.paginate(Bucket=self.bucket, Prefix=self._key(name) + "/"))):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                self._call("delete objects", self.client.delete_objects, Bucket=self.bucket, Delete={"Objects": keys})


def read_json(address: str, client=None) -> dict | None:
    """A small JSON document at a local path or s3:// key; None when it does not exist."""
    if not is_s3(address):
        path = Path(address)
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = split_s3(address)
    client = client or s3_client()
    try:
        return json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
        raise s3_failure(err, "read", address) from None
    except BotoCoreError as err:
        raise s3_failure(err, "read", address) from None


def write_json(address: str, data: dict, client=None) -> None:
    """Write a small JSON document atomically: a local temp file + rename, or one S3 PUT (atomic there)."""
    write_text(address, json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n",
               content_type="application/json", client=client)


def write_text(address: str, text: str, content_type: str = "text/plain", client=None) -> None:
    """Write a small text file atomically: a local temp file + rename, or one S3 PUT (atomic there)."""
    if not is_s3(address):
        from .atomic import write_text as write_local

        write_local(Path(address), text)
        return
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = split_s3(address)
    client = client or s3_client()
    try:
        client.put_object(Bucket=bucket, Key=key, Body=text.encode(), ContentType=content_type)
    except (ClientError, BotoCoreError) as err:
        raise s3_failure(err, "write", address) from None


class CheckpointMirror:
    """A trainer's checkpoints also kept on S3: each new local checkpoint is uploaded (then older ones
    pruned there), and a resume with no complete local checkpoint downloads the newest remote one.
    With `tensorboard`, the run's TensorBoard event files go along to `<uri>/../tensorboard/` (files
    that changed since the last upload), so they sit next to the checkpoints on S3 too.

    With `background`, the upload runs on a thread of its own while training goes on (at 8B a
    checkpoint is 50-100 GB: minutes of upload). One upload at a time: `after_save` and `wait` (the
    next save, the end of the run) wait for the one in flight, and its failure is raised there. The
    trainer must not delete the checkpoint being uploaded: it waits before pruning its local copies."""

    def __init__(self, uri: str, keep_last: int = 3, tensorboard: Path | None = None, background: bool = False):
        self.store = S3CheckpointStore(uri, keep_last=keep_last)
        self.tensorboard = Path(tensorboard) if tensorboard is not None else None
        self._uploaded: dict[str, tuple[int, int]] = {}  # event file -> (size, mtime_ns) last uploaded
        self._uploader = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-upload") if background else None
        self._in_flight: tuple[str, Future] | None = None  # (checkpoint name, its upload)

    def after_save(self, checkpoint: Path) -> str | None:
        """Mirror `checkpoint`, which this trainer has just written: its address once uploaded, or None
        when the upload has started in the background."""
        self.wait()
        if self._uploader is None:
            return self._mirror(Path(checkpoint))
        self._in_flight = (Path(checkpoint).name, self._uploader.submit(self._mirror, Path(checkpoint)))
        return None

    def wait(self, raise_failure: bool = True) -> str | None:
        """Wait for the upload in flight, if any: its address, or its failure raised (a StorageError naming
        the checkpoint). `raise_failure=False` (the run has failed already): the failure is logged."""
        if self._in_flight is None:
            return None
        (name, upload), self._in_flight = self._in_flight, None
        try:
            return upload.result()
        except UserError as err:
            if not raise_failure:
                log.error("the background upload of checkpoint %s to %s failed: %s", name, self.store.uri, err)
                return None
            raise StorageError(f"the background upload of checkpoint {name} to {self.store.uri} failed: {err}") from None
        except Exception:
            if not raise_failure:
                log.exception("the background upload of checkpoint %s to %s failed", name, self.store.uri)
                return None
            raise

    def close(self, raise_failure: bool = True) -> None:
        """The end of the run: wait for the last upload (see `wait`) and stop the upload thread."""
        try:
            self.wait(raise_failure)
        finally:
            if self._uploader is not None:
                self._uploader.shutdown(wait=True)

    def _mirror(self, checkpoint: Path) -> str:
        uri = self.store.upload(checkpoint, just_written=True)
        self.store.prune()
        if self.tensorboard is not None and self.tensorboard.is_dir():
            self._sync_tensorboard()
        return uri

    def _sync_tensorboard(self) -> None:
        store = self.store
        base = store.prefix.rpartition("/")[0]
        for path in sorted(p for p in self.tensorboard.rglob("*") if p.is_file()):
            rel = str(path.relative_to(self.tensorboard))
            stat = path.stat()
            if self._uploaded.get(rel) == (stat.st_size, stat.st_mtime_ns):
                continue
            key = "/".join(x for x in (base, "tensorboard", rel) if x)
            store._call(f"upload {rel}", store.client.upload_file, str(path), store.bucket, key)
            self._uploaded[rel] = (stat.st_size, stat.st_mtime_ns)

    def restore_latest(self, local_root: Path) -> Path | None:
        name = self.store.latest()
        if name is None:
            return None
        return self.store.download(name, Path(local_root) / name)


def put_tree(local_dir: Path, uri: str) -> str:
    """Upload a directory (a model) to `uri` with a manifest written last; returns `uri`."""
    parent, _, name = uri.rstrip("/").rpartition("/")
    S3CheckpointStore(parent).upload(Path(local_dir), name=name)
    return uri.rstrip("/")


def get_tree(uri: str, target: Path) -> Path:
    """Download what put_tree uploaded, every file checked against its manifest; None-free: a missing
    manifest is an error (the upload never finished)."""
    parent, _, name = uri.rstrip("/").rpartition("/")
    store = S3CheckpointStore(parent)
    if not store._has_manifest(name):
        raise StorageError(f"{uri} has no manifest: its upload never finished, so it is not a usable model")
    path = store.download(name, Path(target))
    (path / MANIFEST).unlink()  # a model directory, not a checkpoint
    return path
