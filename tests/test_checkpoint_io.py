"""Checkpoint I/O of the Ray backend (issue #33): every file is hashed once per save, by the rank that
wrote it, and verified once on resume; the S3 upload runs in the background while training goes on,
the next save and the end of the run wait for it, and a failed upload is raised there.

The driver's and the ranks' checkpoint code runs for real (RayGRPO.save_checkpoint / resume,
TrainRank.save_checkpoint / load_checkpoint, DCP over gloo on CPU, boto3 against moto's server on
127.0.0.1); only Ray's remote call is replaced by a direct call on one in-process rank."""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mazerl import integrity
from mazerl.distributed.group import run_group
from mazerl.rl.checkpoint import MANIFEST, CheckpointManager, verify

from conftest import S3_TEST_BUCKET as BUCKET


class HashCount:
    """Every sha256 taken of a file (all hashing goes through integrity.sha256_file), by path."""

    def __init__(self, monkeypatch):
        self.paths: list[Path] = []
        real = integrity.sha256_file

        def counted(path):
            self.paths.append(Path(path))
            return real(path)

        monkeypatch.setattr(integrity, "sha256_file", counted)

    def per_file(self, checkpoint: Path) -> Counter:
        """How often each file of `checkpoint` (or of a temporary sibling `.NAME....tmp` it was written or
        downloaded into) was hashed."""
        parent, name = checkpoint.parent.resolve(), checkpoint.name
        counts: Counter = Counter()
        for path in self.paths:
            path = path.resolve()
            if not path.is_relative_to(parent):
                continue
            folder = parent / path.relative_to(parent).parts[0]
            if folder.name == name or (folder.name.startswith(f".{name}.") and folder.name.endswith(".tmp")):
                counts[path.relative_to(folder).as_posix()] += 1
        return counts


def _model_and_optimizer(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))


def _train_step(model, optimizer, scheduler, seed: int) -> None:
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(seed))
    optimizer.zero_grad(set_to_none=True)
    model(x).pow(2).mean().backward()
    optimizer.step()
    scheduler.step()


class Driver:
    """RayGRPO's checkpoint code (save_checkpoint, resume, the end of run) with one in-process TrainRank."""

    def __init__(self, out: Path, uri: str | None, keep: int = 3):
        # imported here: the ranks spawned by the two-rank test below import this module, and need none of it
        from mazerl.distributed.ray_grpo import RayGRPO, TrainRank
        from mazerl.rl.config import GRPOConfig
        from mazerl.rl.data import MazeSampler

        cfg = GRPOConfig.model_validate({"policy": {"model": "tiny-base"}, "train_data": "unused", "output_dir": str(out),
                                         "keep_checkpoints": keep, "checkpoint_uri": uri})
        self.rank = TrainRank.__new__(TrainRank)  # the rank's own methods, without Ray's actor around them
        self.rank.rank, self.rank.world_size = 0, 1
        self.rank.model, optimizer, scheduler = _model_and_optimizer()
        self.rank.worker = SimpleNamespace(optimizer=optimizer, scheduler=scheduler)
        self.driver = RayGRPO.__new__(RayGRPO)
        d = self.driver
        d.cfg, d.out, d.step, d.sampler = cfg, out, 0, MazeSampler(10, 0)
        d.checkpoints = CheckpointManager(out / "checkpoints", keep)
        d.mirror = RayGRPO.checkpoint_mirror(cfg, out)
        d._on_all_ranks = lambda method, *args: [getattr(self.rank, method)(*args)]

    def train(self) -> None:
        self.driver.step += 1
        _train_step(self.rank.model, self.rank.worker.optimizer, self.rank.worker.scheduler, self.driver.step)

    def save(self) -> Path:
        return self.driver.save_checkpoint()


def test_every_file_is_hashed_once_per_save_and_verified_once_on_resume(s3, tmp_path, monkeypatch):
    """Save + upload + resume (same pod, and a new pod from S3): once per file for the save (not again
    before the upload), once for the resume (not again by the ranks)."""
    from mazerl.storage import S3CheckpointStore

    hashes = HashCount(monkeypatch)
    uri = f"s3://{BUCKET}/runs/count/checkpoints"
    run = Driver(tmp_path / "pod1", uri)
    run.train()
    checkpoint = run.save()
    run.driver.finish_uploads()  # the end of the run: the upload is done
    files = set(json.loads((checkpoint / MANIFEST).read_text())["files"])
    assert hashes.per_file(checkpoint) == Counter({f: 1 for f in files}), "a save (and its upload) hashes each file once"
    assert [n for _, n in S3CheckpointStore(uri).complete()] == [checkpoint.name]

    hashes.paths.clear()
    again = Driver(tmp_path / "pod1", uri)  # the same pod restarts: the local checkpoint
    assert again.driver.resume("auto") == 1
    assert hashes.per_file(checkpoint) == Counter({f: 1 for f in files}), "a resume verifies each file once"
    assert all(torch.equal(a, b) for a, b in zip(again.rank.model.state_dict().values(), run.rank.model.state_dict().values()))

    hashes.paths.clear()
    fresh = Driver(tmp_path / "pod2", uri)  # a new pod: the checkpoint comes from S3, checked as it lands
    assert fresh.driver.resume("auto") == 1
    restored = tmp_path / "pod2" / "checkpoints" / checkpoint.name
    assert hashes.per_file(restored) == Counter({f: 1 for f in files})


def _save_and_load_on_two_ranks(rank: int, world: int, ckpt: str, out: str) -> None:
    """Each rank: FSDP2 shards of a small model, one step, a sharded save, then a load the driver has
    verified; which files this rank hashed goes to OUT/rank-R.json."""
    from torch.distributed.fsdp import fully_shard

    from mazerl.distributed.checkpoint import load_sharded, save_sharded

    hashed: list[str] = []
    real = integrity.sha256_file
    integrity.sha256_file = lambda path: hashed.append(str(path)) or real(path)
    model, _, _ = _model_and_optimizer()
    for layer in (model[0], model[2], model):
        fully_shard(layer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    _train_step(model, optimizer, scheduler, 1)
    save_sharded(ckpt, model, optimizer, scheduler, {"step": 1}, rank, world)
    saved = len(hashed)
    load_sharded(ckpt, model, optimizer, scheduler, rank, world, verified=True)
    Path(out, f"rank-{rank}.json").write_text(json.dumps({"save": hashed[:saved], "load": hashed[saved:]}))


def test_each_rank_hashes_the_shards_it_wrote_and_no_other(tmp_path):
    """Two FSDP2 ranks over gloo: the manifest's hashes come from the rank that wrote each file, all
    ranks at once; rank 0 reads no other rank's shard; a load after the driver's check hashes nothing."""
    ckpt = tmp_path / "step-00000001"
    run_group(2, _save_and_load_on_two_ranks, str(ckpt), str(tmp_path))
    assert verify(ckpt) is None  # the merged manifest is right: a full check agrees
    files = set(json.loads((ckpt / MANIFEST).read_text())["files"])
    tmp = (tmp_path / ".step-00000001.tmp").resolve()
    by_rank = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    saved = [[Path(p).resolve().relative_to(tmp).as_posix() for p in r["save"]] for r in by_rank]
    assert Counter(saved[0] + saved[1]) == Counter({f: 1 for f in files})
    assert set(saved[1]) == {"dcp/__1_0.distcp", "rank-00001.pt"}  # its own shard and its own state
    assert not any(name.startswith("dcp/__1_") or name == "rank-00001.pt" for name in saved[0])
    assert by_rank[0]["load"] == by_rank[1]["load"] == []


class SlowManifest:
    """An S3 upload held at its last request (the manifest's PUT) until the test lets it go: every
    file is up by then, so what is visible on S3 mid-upload can be checked."""

    def __init__(self, store):
        self.reached, self.release = threading.Event(), threading.Event()
        self.released_in_time = None
        self.threads: set[str] = set()
        store.client.meta.events.register("before-send.s3.PutObject", self._hold)

    def _hold(self, request, **kwargs):
        if request.url.split("?")[0].endswith(MANIFEST) and self.released_in_time is None:
            self.threads.add(threading.current_thread().name)
            self.reached.set()
            # on the training thread (a synchronous upload) nobody could release it: give up, the test fails
            self.released_in_time = self.release.wait(timeout=20)


def test_the_upload_runs_while_training_goes_on_and_the_next_save_waits_for_it(s3, tmp_path):
    from mazerl.storage import S3CheckpointStore

    uri = f"s3://{BUCKET}/runs/slow/checkpoints"
    run = Driver(tmp_path / "out", uri, keep=1)
    slow = SlowManifest(run.driver.mirror.store)
    run.train()
    first = run.save()  # returns while the upload is in flight
    assert slow.reached.wait(timeout=20) and threading.current_thread().name not in slow.threads
    reader = S3CheckpointStore(uri)
    uploaded = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="runs/slow/checkpoints/").get("Contents", [])]
    assert uploaded and reader.complete() == []  # files up, manifest not yet: nothing visible on S3
    before = [p.detach().clone() for p in run.rank.model.parameters()]
    run.train()  # the loop goes on during the upload
    assert any(not torch.equal(a, b) for a, b in zip(before, run.rank.model.parameters()))
    slow.release.set()
    second = run.save()  # waits for step 1's upload, then prunes it locally (keep 1) and uploads step 2
    assert slow.released_in_time and not first.exists()
    run.driver.finish_uploads()
    assert [n for _, n in reader.complete()] == [second.name]  # keep 1 on S3 too
    assert verify(reader.download(second.name, tmp_path / "back" / second.name)) is None


def test_a_failed_background_upload_is_raised_at_the_next_save_and_at_the_end(s3, tmp_path):
    from mazerl.storage import StorageError

    run = Driver(tmp_path / "out", "s3://no-such-bucket-mazerl/runs/checkpoints")
    run.train()
    run.save()  # the upload fails in the background; training goes on
    run.train()
    with pytest.raises(StorageError, match="step-00000001.*NoSuchBucket"):
        run.save()
    run.train()
    run.save()
    with pytest.raises(StorageError, match="step-00000003.*NoSuchBucket"):
        run.driver.finish_uploads()
    run.driver.finish_uploads()  # raised once, not again
