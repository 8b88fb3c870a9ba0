"""What the Ray backend costs: the same GRPO config run in process and on Ray, side by side.

Target (issue #11): Ray with 1 rank and 1 rollout actor costs <= 1.25x the in-process step time.
With 2 ranks the step is split into rollout, update and weight sync. Steady-state steps only (the
first step, which pays for actor start-up and warm-up, is left out). Writes OUT/distributed.json.

  python benchmarks/bench_distributed.py --steps 6 --out outputs/bench-distributed
"""

from __future__ import annotations

import argparse
import json
import shutil
import os
import statistics
import time
from pathlib import Path

from mazerl.atomic import write_json
from mazerl.metrics import read_metrics
from mazerl.rl.config import GRPOConfig


def run(cfg: GRPOConfig) -> tuple[list[dict], float]:
    t0 = time.perf_counter()
    if cfg.distributed.backend == "ray":
        from mazerl.distributed.ray_grpo import RayGRPO

        RayGRPO(cfg).run(resume="never")
    else:
        from mazerl.rl.trainer import GRPOTrainer

        GRPOTrainer(cfg).run(resume="never")
    return read_metrics(Path(cfg.output_dir) / "metrics.jsonl"), time.perf_counter() - t0


def steady(log: list[dict], key: str) -> float:
    values = [r[key] for r in log[1:] if key in r]
    return statistics.median(values) if values else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mazes", type=Path, help="dataset directory (default: generate the smoke preset into OUT/mazes)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", type=Path, default=Path("outputs/bench-distributed"))
    args = ap.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    mazes = args.mazes
    if mazes is None:
        from mazerl.mazes.splits import generate_dataset, preset

        mazes = args.out / "mazes"
        if not (mazes / "manifest.json").exists():
            generate_dataset(preset("smoke"), mazes, overwrite=True)
    base = {"policy": {"model": "tiny-base"}, "train_data": str(mazes / "train.parquet"), "steps": args.steps,
            "mazes_per_step": 8, "group_size": 8, "micro_batch": 64, "update_turns_per_episode": 4, "eval_every": 0,
            "checkpoint_every": 10_000, "optim": {"lr": 1e-4}, "env": {"progress_reward": 0.1}}
    runs = {
        "in-process": {},
        "ray 1 rank + 1 rollout actor": {"distributed": {"backend": "ray", "ranks": 1, "rollout_workers": 1, "cpus_per_actor": 1}},
        "ray 2 ranks + 1 rollout actor": {"distributed": {"backend": "ray", "ranks": 2, "rollout_workers": 1, "cpus_per_actor": 0.5}},
    }
    results = {}
    for name, extra in runs.items():
        run_dir = args.out / name.replace(" ", "-").replace("+", "")
        shutil.rmtree(run_dir, ignore_errors=True)  # this benchmark's own earlier output: a rerun starts clean
        cfg = GRPOConfig.model_validate({**base, **extra, "output_dir": str(run_dir)})
        log, wall = run(cfg)
        results[name] = {k: steady(log, k) for k in ("time/step", "time/rollout", "time/update", "time/weight_sync")}
        results[name]["wall_s_incl_startup"] = wall
        print(name, json.dumps(results[name]), flush=True)
    ratio = results["ray 1 rank + 1 rollout actor"]["time/step"] / results["in-process"]["time/step"]
    summary = {"steps": args.steps, "median_of_steps_2_on": results, "ray1_over_inprocess_step_time": ratio,
               "target": "<= 1.25", "cpus": os.cpu_count()}
    write_json(args.out / "distributed.json", summary)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
