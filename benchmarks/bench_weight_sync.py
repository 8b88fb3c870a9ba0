"""Weight sync into a vLLM engine on Ray: the path before issue 33 (item 5), rebuilt here, against the
shipped one (vLLM CPU build, a tiny Qwen3-VL, one training rank and its rollout actor).

    .venv-vllm/bin/python benchmarks/bench_weight_sync.py --json OUT [--size medium] [--syncs 5]

- before: rank 0 returns the whole state dict to the driver (ray.get), the driver ray.put's it, the
  rollout actor writes it as safetensors to a temporary folder and vLLM reloads it from there
  (`collective_rpc("reload_weights", weights_path=...)`), then the caches are reset;
- now (`RayGRPO.sync_weights`): the rank gathers bucket by bucket and pushes each bucket straight into
  the engine (placement colocated: `direct`; split: `broadcast-gloo`), loaded through the model's own
  `load_weights` in vLLM's worker.

Measured per sync: seconds; bytes of tensors the driver received; bytes the rollout actor's process
passed to write() (/proc/self/io wchar: files, pipes and sockets alike) and the size of files written.
Both paths run in the same actors, with vLLM's engine core in the actor's process (as shipped).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch


def _write_syscall_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    return 0


def _tensor_bytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def legacy_worker_class():
    """The rollout actor with the path it had before, for comparison only."""
    from mazerl.distributed.ray_grpo import RolloutWorker

    class LegacyRolloutWorker(RolloutWorker):
        def io_bytes(self) -> int:
            return _write_syscall_bytes()

        def legacy_sync(self, weights: dict, version: int) -> dict:
            """What VLLMEngine.sync_weights did: safetensors to a private folder, vLLM reloads from it."""
            import os

            from safetensors.torch import save_file

            engine = self.tp.engine
            if not hasattr(self, "_legacy_dir"):
                self._legacy_dir = Path(tempfile.mkdtemp(prefix="bench-weights-"))
            target = self._legacy_dir / "model.safetensors"
            tmp = target.with_suffix(".tmp")
            save_file({k: v.detach().to("cpu").contiguous().clone() for k, v in weights.items()}, str(tmp))
            os.replace(tmp, target)
            written = target.stat().st_size
            engine.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(self._legacy_dir)})
            engine.llm.llm_engine.reset_encoder_cache()
            engine.llm.reset_prefix_cache()
            engine.weights_version = version
            return {"file_bytes": written}

    return LegacyRolloutWorker


def run(placement: str, model_dir: Path, mazes: Path, out: Path, syncs: int, bucket_mb: int) -> dict:
    import ray

    import mazerl.distributed.ray_grpo as ray_grpo
    from mazerl.rl.config import GRPOConfig

    cfg = GRPOConfig.model_validate({
        "policy": {"model": str(model_dir), "engine": "vllm", "prompt": "short", "max_new_tokens": 8},
        "train_data": str(mazes), "output_dir": str(out), "steps": 1, "mazes_per_step": 1, "group_size": 2, "max_turns": 3,
        "eval_every": 0, "max_minutes": None,
        "distributed": {"backend": "ray", "ranks": 1, "rollout_workers": 1, "cpus_per_actor": 0.5, "placement": placement,
                        "weight_sync_bucket_mb": bucket_mb}})
    shipped = ray_grpo.RolloutWorker
    ray_grpo.RolloutWorker = legacy_worker_class()  # the same actor, with the old path beside the new one
    try:
        g = ray_grpo.RayGRPO(cfg)
    finally:
        ray_grpo.RolloutWorker = shipped
    received = {"bytes": 0}
    original_get = ray.get

    def watched_get(refs, *a, **k):
        value = original_get(refs, *a, **k)
        received["bytes"] += _tensor_bytes(value)
        return value

    ray.get = watched_get
    actor = g.rollouts[0]
    rows = {"before": [], "now": []}
    try:
        g.sync_weights()  # warm-up: the actors finish starting here
        for step in range(1, syncs + 1):
            g.step = step
            # before: whole state dict through the driver, safetensors, reload from disk
            received["bytes"], io0 = 0, original_get(actor.io_bytes.remote())
            t0 = time.perf_counter()
            weights = ray.get(g.ranks[0].full_state_dict.remote())
            ref = ray.put(weights)
            legacy = ray.get(actor.legacy_sync.remote(ref, step))
            seconds = time.perf_counter() - t0
            del weights, ref
            rows["before"].append({"seconds": seconds, "driver_bytes": received["bytes"], "file_bytes": legacy["file_bytes"],
                                   "actor_write_bytes": original_get(actor.io_bytes.remote()) - io0})
            # now: buckets from the rank straight into the engine
            received["bytes"], io0 = 0, original_get(actor.io_bytes.remote())
            t0 = time.perf_counter()
            metrics = g.sync_weights()
            seconds = time.perf_counter() - t0
            rows["now"].append({"seconds": seconds, "driver_bytes": received["bytes"], "file_bytes": 0,
                                "actor_write_bytes": original_get(actor.io_bytes.remote()) - io0,
                                "engine_bytes": metrics["weight_sync/bytes"], "buckets": metrics["weight_sync/buckets"]})
        mode = g.weight_sync_mode
    finally:
        ray.get = original_get
        g.shutdown()
    summary = {path: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for path, rs in rows.items()}
    return {"placement": placement, "mode": mode, "median": summary, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--size", default="medium", help="tiny model size (mazerl policy init-tiny --size)")
    ap.add_argument("--syncs", type=int, default=5)
    ap.add_argument("--bucket-mb", type=int, default=4)
    ap.add_argument("--placements", nargs="+", default=["colocated", "split"])
    args = ap.parse_args()
    import os

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.pop("RAY_ADDRESS", None)
    from mazerl.mazes.splits import DatasetConfig, generate_dataset
    from mazerl.policy.tiny import init_tiny

    work = Path(tempfile.mkdtemp(prefix="bench-weight-sync-"))
    model_dir = init_tiny(work / "tiny", size=args.size, seed=0)
    generate_dataset(DatasetConfig.model_validate(
        {"reference_splits": {}, "splits": {"train": {"count": 4, "sizes": ["3x3"]}}}), work / "mazes")
    result = {"size": args.size, "bucket_mb": args.bucket_mb, "syncs": args.syncs, "runs": []}
    for placement in args.placements:
        row = run(placement, model_dir, work / "mazes" / "train.parquet", work / f"run-{placement}", args.syncs, args.bucket_mb)
        result["runs"].append(row)
        print(json.dumps({"placement": placement, "mode": row["mode"], **row["median"]}), flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    sys.exit(main())
