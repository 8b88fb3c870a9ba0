"""Checkpoint hashing and S3 upload inside the training loop, before and after issue #33 (defect 11).

A real checkpoint of a model-sized payload (~200 MB: a 16.8M-parameter model with its AdamW state,
FSDP2 over 2 gloo ranks on CPU, written by `save_sharded`), uploaded to moto's S3 server on 127.0.0.1.

before (the code up to issue #33), all of it in the loop:
  rank 0 hashes every file of the checkpoint while the other ranks wait in a barrier (`manifest_of`),
  then the driver hashes every file again (`verify`) and uploads synchronously (`S3CheckpointStore.upload`).
after:
  each rank hashes the files it wrote, all ranks at once (the slowest rank is what the loop waits for);
  the upload runs on a background thread; the loop waits only at the next save, and only for what is
  left of the upload after a training step.

  python benchmarks/bench_checkpoint_io.py --out outputs/bench-checkpoint-io
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import torch


def _rank(rank: int, world: int, ckpt: str, out: str) -> None:
    """Write the checkpoint (the real save), then time the hashing each way on the files as written."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from mazerl.distributed.checkpoint import save_sharded
    from mazerl.integrity import hash_files, manifest_of

    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(2048, 2048) for _ in range(4)))
    for layer in (*model, model):
        fully_shard(layer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    model(torch.randn(8, 2048)).pow(2).mean().backward()
    optimizer.step()
    dist.barrier()
    t0 = time.perf_counter()
    save_sharded(ckpt, model, optimizer, scheduler, {"step": 1}, rank, world)
    save_s = time.perf_counter() - t0
    ckpt = Path(ckpt)
    own = [f"dcp/__{rank}_0.distcp", f"rank-{rank:05d}.pt"]
    dist.barrier()
    t0 = time.perf_counter()
    hash_files(ckpt, own)  # after: this rank's share, all ranks at once
    own_s = time.perf_counter() - t0
    dist.barrier()
    all_s = None
    if rank == 0:  # before: rank 0 alone hashed every file (the other ranks waited)
        t0 = time.perf_counter()
        manifest_of(ckpt, "manifest.json")
        all_s = time.perf_counter() - t0
    Path(out, f"rank-{rank}.json").write_text(json.dumps({"save_s": save_s, "own_hash_s": own_s, "all_hash_s": all_s}))


def _train_for(seconds: float) -> int:
    """A stand-in training step: matmuls for about `seconds` (torch releases the GIL, as real steps do)."""
    a = torch.randn(512, 512)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a = torch.tanh(a @ a.T / 512)
        n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="outputs/bench-checkpoint-io")
    ap.add_argument("--step-seconds", type=float, default=10.0, help="the training step between two saves")
    args = ap.parse_args()
    import logging

    from moto.server import ThreadedMotoServer

    from mazerl.atomic import write_json
    from mazerl.distributed.group import free_port, run_group
    from mazerl.rl.checkpoint import verify
    from mazerl.storage import CheckpointMirror, S3CheckpointStore

    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    ckpt = out / "checkpoints" / "step-00000001"
    run_group(2, _rank, str(ckpt), str(out), backend="gloo")
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]
    size = sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file())

    port = free_port()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
                      AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
    try:
        import boto3

        boto3.client("s3").create_bucket(Bucket="bench")
        # before: the driver verified (every file hashed again) and uploaded, the loop waiting
        store = S3CheckpointStore("s3://bench/before")
        t0 = time.perf_counter()
        assert verify(ckpt) is None
        verify_s = time.perf_counter() - t0
        store.upload(ckpt, just_written=True)
        upload_s = time.perf_counter() - t0 - verify_s
        # after: the upload starts in the background; the loop trains one step, and the next save waits
        mirror = CheckpointMirror("s3://bench/after", background=True)
        t0 = time.perf_counter()
        mirror.after_save(ckpt)
        submit_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        _train_for(args.step_seconds)
        step_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        mirror.wait()
        waited_s = time.perf_counter() - t0
        mirror.close()
        assert S3CheckpointStore("s3://bench/after").latest() == ckpt.name
    finally:
        server.stop()

    hash_before = ranks[0]["all_hash_s"]
    hash_after = max(r["own_hash_s"] for r in ranks)
    result = {
        "checkpoint_bytes": size, "step_seconds": step_s,
        "before": {"rank0_hashes_all_s": hash_before, "driver_verify_s": verify_s, "sync_upload_s": upload_s,
                   "in_loop_s": hash_before + verify_s + upload_s},
        "after": {"slowest_rank_hashes_own_s": hash_after, "submit_upload_s": submit_s, "wait_at_next_save_s": waited_s,
                  "in_loop_s": hash_after + submit_s + waited_s},
        "save_sharded_s_per_rank": [r["save_s"] for r in ranks],
    }
    write_json(out / "checkpoint_io.json", result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
