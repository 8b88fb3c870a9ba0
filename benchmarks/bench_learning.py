"""Does GRPO make tiny-base better, and how fast? GRPO for a time budget from the shipped base,
greedy success on a fixed set of held-out mazes every few minutes, then the pipeline's own evaluation of the
base and the final model and its guarded gate.

The held-out mazes are the `default` preset's (frozen, never in pretraining or GRPO data: checked
here by walls hash before anything runs). Success is what is measured, never the shaped reward.
The final judgement is `workflow.evaluate` (500 heldout mazes, 100 of each shift split, VisGym easy-64 and
hard-64 in full) of both models and `workflow.compare` with the shipped guard settings: every split's gain
with its interval and McNemar p, loops, and whether the pipeline would have promoted the model.
Writes OUT/learning.json and the curve as a PNG (default docs/learning_curve.png).

Usage (the issue's benchmark: 60 minutes, 500 mazes, every 5 minutes):
  python benchmarks/bench_learning.py --minutes 60 --steps 450 --eval-every-minutes 5 --eval-mazes 500 \
      --set mazes_per_step=48 --out outputs/bench-learning --png docs/learning_curve.png

(tiny-grpo's 2e-4 peak rate, at 48 mazes a step instead of the demo's 16: 0.312 -> 0.596 in 52
training minutes, +28.4 points, where 16 mazes a step had given +20.8; at a 4e-4 peak an hour's run went
unstable near step 100. docs/BENCHMARKS.md, "GRPO learning: the hour"; docs/history.md.)

`--steps` is the run's length in GRPO steps, and so the horizon of the config's learning-rate schedule
(tiny-grpo: cosine); `--minutes` stops the run early, with a checkpoint, on a machine slower than the
steps assume (the schedule is then fitted to the deadline: `fit_schedule_to_max_minutes`).
`--train-data` trains on another train split with the same evaluation mazes; `--train-pool NAME` generates one of
bench_signals.py's pools (e.g. `mostly-4x4`: VisGym's 4x4 level and one 5x5 maze in ten) beside the dataset, with
the same evaluation splits, and trains on it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench_signals import POOLS, train_pool  # the pools bench_signals.py compares, a sibling script
from mazerl.atomic import write_json
from mazerl.config import load_config
from mazerl.evaluation.stats import paired_comparison, wilson_interval
from mazerl.mazes.dataset_io import read_split
from mazerl.rollout.factory import open_policy
from mazerl.policy.config import PolicyConfig
from mazerl.rl.config import GRPOConfig
from mazerl.metrics import read_metrics
from mazerl.rl.driver import episode_metrics
from mazerl.rl.trainer import GRPOTrainer
from mazerl.rollout.multiturn import items_from_split, rollout


def greedy_play(policy: PolicyConfig, split: Path, n: int) -> tuple[list[bool], dict]:
    """Greedy success per maze, and what is reported beside it (parse failures, bumps, loops, stops, steps)."""
    tp = open_policy(policy)
    df = read_split(split)
    items = items_from_split(df, range(min(n, len(df))), policy.render_scale)
    trajs = rollout(tp.engine, tp.chat, items, sampling=tp.sampling(temperature=0.0), history=policy.history)
    side = {k: v for k, v in episode_metrics(trajs).items() if k not in ("reward_mean", "success_rate")}
    wins = [t.stats for t in trajs if t.stats.success]
    side["steps_over_optimal_of_successes"] = sum(s.moves / s.optimal_moves for s in wins) / len(wins) if wins else None
    return [bool(t.stats.success) for t in trajs], side


def check_unseen(mazes: Path, train_data: Path, model: str) -> dict:
    """No evaluation layout in GRPO's pool or in the base's pretraining pool (walls, up to symmetry)."""
    from mazerl.rl.pretrain import POOL_FILE

    heldout = set(read_split(mazes / "heldout.parquet").walls_hash)
    train = set(read_split(train_data).walls_hash)
    assert not heldout & train, "GRPO's train split shares layouts with heldout"
    pool_file = Path(model) / POOL_FILE
    pretrain = set(read_split(pool_file).walls_hash) if pool_file.exists() else set()
    assert not heldout & pretrain, "the base's pretraining pool shares layouts with heldout"
    return {"heldout_layouts": len(heldout), "grpo_train_layouts": len(train), "pretraining_layouts": len(pretrain),
            "overlap": 0}


def pipeline_gate(base_model: str, final: Path, mazes: Path, out: Path, grpo_config: str) -> dict:
    """Both models evaluated as the pipeline evaluates them and judged by its guarded gate (shipped settings)."""
    from mazerl.profiles import load_profile
    from mazerl.workflow import compare, evaluate

    sizes = load_profile("local").pipeline  # what the demo evaluates
    for label, model in (("base", base_model), ("final", str(final))):
        evaluate(model, str(mazes), str(out / f"eval-{label}"), sizes.eval_heldout_mazes, sizes.eval_other_mazes,
                 config=grpo_config, label=label)
    result = compare(str(out / "eval-base"), str(out / "eval-final"), str(out / "compare"), min_gain=0.0, max_p_value=0.05)
    keep = ("mazes", "success_base", "success_new", "success_diff", "success_diff_ci95", "mcnemar_p",
            "loop_rate_base", "loop_rate_new", "loop_mcnemar_p")
    gate = {"splits": {name: {k: row[k] for k in keep} for name, row in result["splits"].items()},
            "promoted": result["decision"]["improved"], "blocked_by": result["decision"]["blocked_by"],
            "undecided": result["decision"]["undecided"], "comparison": str(out / "compare" / "comparison.json")}
    for name, row in gate["splits"].items():
        print(f"{name}: {row['success_base']:.3f} -> {row['success_new']:.3f} ({100 * row['success_diff']:+.1f} points, "
              f"p = {row['mcnemar_p']:.2g}); loops {row['loop_rate_base']:.3f} -> {row['loop_rate_new']:.3f} "
              f"(p = {row['loop_mcnemar_p']:.2g})", flush=True)
    why = f"blocked by {', '.join(gate['blocked_by'])}" if gate["blocked_by"] else "heldout gain not significant"
    print("gate: " + ("promoted" if gate["promoted"] else f"not promoted ({why})"))
    return gate


def plot(curve: list[dict], base_rate: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = [c["training_minutes"] for c in curve]
    ax.plot(xs, [c["success"] for c in curve], marker="o", label="GRPO (greedy, held-out)")
    lo = [c["wilson95"][0] for c in curve]
    hi = [c["wilson95"][1] for c in curve]
    ax.fill_between(xs, lo, hi, alpha=0.2)
    ax.axhline(base_rate, color="grey", linestyle="--", label="tiny-base")
    ax.set_xlabel("GRPO training minutes (2 CPU cores)")
    ax.set_ylabel(f"success on {curve[0]['mazes']} held-out mazes")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    ax.set_title("tiny-base -> GRPO, VisGym-easy size, 18 turns")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-base", help="base model (default: the shipped tiny-base)")
    ap.add_argument("--mazes", type=Path, help="dataset directory (default: generate the default preset into OUT/mazes)")
    ap.add_argument("--train-data", type=Path, help="train split parquet (default: the dataset's train.parquet)")
    ap.add_argument("--train-pool", choices=sorted(POOLS), help="train on this pool, generated in OUT/mazes-NAME")
    ap.add_argument("--grpo-config", default="tiny-grpo")
    ap.add_argument("--minutes", type=float, default=60.0, help="training minutes at most (evaluations not counted)")
    ap.add_argument("--steps", type=int, default=250, help="GRPO steps: the learning-rate schedule's horizon")
    ap.add_argument("--eval-every-minutes", type=float, default=5.0)
    ap.add_argument("--eval-mazes", type=int, default=500)
    ap.add_argument("--set", action="append", default=[], help="GRPO config override key=value")
    ap.add_argument("--out", type=Path, default=Path("outputs/bench-learning"))
    ap.add_argument("--png", type=Path, default=Path("docs/learning_curve.png"))
    args = ap.parse_args()
    if args.train_pool and args.train_data:
        ap.error("give --train-data or --train-pool, not both")

    from mazerl.config import parse_overrides
    from mazerl.mazes.splits import generate_dataset, preset
    from mazerl.mazes.visgym import reference_file

    mazes = args.mazes
    if mazes is None:
        mazes = args.out / "mazes"
        if not (mazes / "manifest.json").exists():
            generate_dataset(preset("default"), mazes, reference_file(), overwrite=True)
    if args.train_pool:
        args.train_data = train_pool(args.train_pool, mazes, args.out / f"mazes-{args.train_pool}")
    cfg = load_config(GRPOConfig, args.grpo_config, {
        "policy.model": args.model, "train_data": str(args.train_data or mazes / "train.parquet"),
        "eval_data": str(mazes / "heldout.parquet"), "output_dir": str(args.out / "grpo"),
        "steps": args.steps, "max_minutes": args.minutes, "eval_every": 0,
        "eval_every_minutes": args.eval_every_minutes, "eval_mazes": args.eval_mazes, **parse_overrides(args.set),
    })
    unseen = check_unseen(mazes, Path(cfg.train_data), cfg.policy.model)
    heldout = mazes / "heldout.parquet"
    base, base_side = greedy_play(cfg.policy, heldout, args.eval_mazes)
    print(f"base: {sum(base)}/{len(base)} greedy successes", flush=True)

    t0 = time.perf_counter()
    last = GRPOTrainer(cfg, on_step=lambda s, r: print(
        f"step {s}: reward {r['reward_mean']:.3f} success {r['success_rate']:.3f} train {r['time/training_total'] / 60:.1f} min"
        + (f"  heldout {r['eval/success']:.3f} (premature stops {r['eval/premature_stop_rate']:.3f})"
           if "eval/success" in r else ""), flush=True,
    )).run(resume="never")
    wall = time.perf_counter() - t0

    final_policy = cfg.policy.model_copy(update={"model": str(args.out / "grpo" / "final")})
    new, new_side = greedy_play(final_policy, heldout, args.eval_mazes)
    cmp = paired_comparison(base, new)
    curve = [{"training_minutes": 0.0, "step": 0, "success": sum(base) / len(base), "mazes": len(base),
              "wilson95": list(wilson_interval(sum(base), len(base)))}]
    for r in read_metrics(args.out / "grpo" / "metrics.jsonl"):
        if "eval/success" in r and r["step"] > 0:
            k = round(r["eval/success"] * r["eval/mazes"])
            curve.append({"training_minutes": r.get("eval/training_minutes", 0.0), "step": r["step"], "success": r["eval/success"],
                          "mazes": r["eval/mazes"], "wilson95": list(wilson_interval(k, r["eval/mazes"])),
                          "loop_rate": r.get("eval/loop_rate"), "premature_stop_rate": r.get("eval/premature_stop_rate")})
    curve.append({"training_minutes": last.get("time/training_total", 0) / 60, "step": last.get("step"),
                  "success": sum(new) / len(new), "mazes": len(new), "wilson95": list(wilson_interval(sum(new), len(new)))})
    plot(curve, sum(base) / len(base), args.png)
    result = {
        "eval_mazes": len(base), "unseen_check": unseen,
        "base": {"model": cfg.policy.model, "success": sum(base), "rate": cmp.base_rate, "wilson95": wilson_interval(sum(base), len(base)),
                 **base_side},
        "grpo": {"success": sum(new), "rate": cmp.new_rate, "wilson95": wilson_interval(sum(new), len(new)), **new_side},
        "difference": {"points": 100 * cmp.diff, "ci95_points": [100 * cmp.diff_low, 100 * cmp.diff_high],
                       "mcnemar_p": cmp.p_value, "only_base": cmp.only_base, "only_grpo": cmp.only_new},
        "grpo_steps": last.get("step"), "grpo_training_minutes": last.get("time/training_total", 0) / 60,
        "wall_minutes_incl_evals": wall / 60, "curve": curve, "png": str(args.png),
        "gate": pipeline_gate(cfg.policy.model, args.out / "grpo" / "final", mazes, args.out, args.grpo_config),
        "config": cfg.model_dump(mode="json"),
    }
    write_json(args.out / "learning.json", result)
    print(json.dumps({k: v for k, v in result.items() if k != "config"}, indent=2))


if __name__ == "__main__":
    main()
