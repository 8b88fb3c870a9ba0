"""Does GRPO make the tiny model better? Warm start -> GRPO for a time budget -> paired evaluation.

Greedy success of the warm-start checkpoint and of the GRPO result on the same held-out mazes,
with Wilson intervals, the paired difference and the exact McNemar p-value; plus the training
curve (periodic greedy success on a small subset).

Usage:
  python benchmarks/bench_learning.py --warm outputs/demo/sft/final --mazes outputs/demo/mazes \
      --grpo-config configs/tiny-grpo.yaml --minutes 15 --eval-mazes 500 --out outputs/bench-learning
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from mazerl.atomic import write_json
from mazerl.config import load_config
from mazerl.evaluation.stats import paired_comparison, wilson_interval
from mazerl.mazes.dataset_io import read_split
from mazerl.rl.common import open_policy
from mazerl.rl.config import GRPOConfig, PolicyConfig
from mazerl.rl.metrics import read_metrics
from mazerl.rl.trainer import GRPOTrainer
from mazerl.rollout.engine import SamplingParams
from mazerl.rollout.multiturn import items_from_split, rollout


def greedy_successes(model_dir: str, policy: PolicyConfig, split: Path, n: int) -> tuple[list[bool], float]:
    tp = open_policy(policy.model_copy(update={"model": model_dir}))
    df = read_split(split)
    items = items_from_split(df, range(min(n, len(df))), policy.render_scale)
    t0 = time.perf_counter()
    trajs = rollout(tp.engine, tp.chat, items, sampling=SamplingParams(temperature=0.0, max_new_tokens=policy.max_new_tokens),
                    history=policy.history)
    return [t.stats.success for t in trajs], time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warm", required=True, help="warm-start model directory")
    ap.add_argument("--mazes", required=True, type=Path, help="dataset directory (train + heldout)")
    ap.add_argument("--grpo-config", required=True)
    ap.add_argument("--minutes", type=float, default=15.0)
    ap.add_argument("--eval-mazes", type=int, default=500)
    ap.add_argument("--eval-split", type=Path, help="split for the before/after evaluation (default: MAZES/heldout.parquet)")
    ap.add_argument("--curve-every", type=int, default=5)
    ap.add_argument("--curve-mazes", type=int, default=64)
    ap.add_argument("--out", type=Path, default=Path("outputs/bench-learning"))
    args = ap.parse_args()

    cfg = load_config(GRPOConfig, args.grpo_config, {
        "policy.model": args.warm, "train_data": str(args.mazes / "train.parquet"),
        "eval_data": str(args.eval_split or args.mazes / "heldout.parquet"), "output_dir": str(args.out / "grpo"),
        "steps": 10_000, "max_minutes": args.minutes, "eval_every": args.curve_every, "eval_mazes": args.curve_mazes,
    })
    heldout = args.eval_split or args.mazes / "heldout.parquet"
    base, base_s = greedy_successes(args.warm, cfg.policy, heldout, args.eval_mazes)
    print(f"warm start: {sum(base)}/{len(base)} greedy successes ({base_s:.0f} s)", flush=True)

    t0 = time.perf_counter()
    last = GRPOTrainer(cfg, on_step=lambda s, r: print(
        f"step {s}: reward {r['reward_mean']:.3f} success {r['success_rate']:.3f} "
        f"train {r['time/training_total']:.0f}s" + (f" eval {r['eval/success']:.3f}" if "eval/success" in r else ""), flush=True,
    )).run(resume="never")
    wall = time.perf_counter() - t0

    new, new_s = greedy_successes(str(args.out / "grpo" / "final"), cfg.policy, heldout, args.eval_mazes)
    cmp = paired_comparison(base, new)
    curve = [{"step": r["step"], "eval_success": r["eval/success"], "train_success": r.get("success_rate")}
             for r in read_metrics(args.out / "grpo" / "metrics.jsonl") if "eval/success" in r]
    result = {
        "eval_mazes": len(base),
        "warm_start": {"success": sum(base), "rate": cmp.base_rate, "wilson95": wilson_interval(sum(base), len(base))},
        "grpo": {"success": sum(new), "rate": cmp.new_rate, "wilson95": wilson_interval(sum(new), len(new))},
        "difference": {"points": 100 * cmp.diff, "ci95_points": [100 * cmp.diff_low, 100 * cmp.diff_high],
                       "mcnemar_p": cmp.p_value, "only_warm": cmp.only_base, "only_grpo": cmp.only_new},
        "grpo_steps": last.get("step"), "grpo_training_minutes": last.get("time/training_total", 0) / 60,
        "grpo_wall_minutes_incl_curve_evals": wall / 60, "curve": curve,
        "config": cfg.model_dump(mode="json"),
    }
    write_json(args.out / "learning.json", result)
    print(json.dumps({k: v for k, v in result.items() if k != "config"}, indent=2))


if __name__ == "__main__":
    main()
