"""Training signals side by side: which of the critics' questions, put as reward, changes what GRPO learns?

    python benchmarks/bench_signals.py [--variants baseline,loop,...] [--train-seeds 1,2,3] [--steps 120] [--out DIR]

Every variant is the shipped `tiny-grpo` job (the demo's GRPO) from the shipped tiny-base on the same
`default` dataset and the same train seeds, changed only by its overrides (VARIANTS below), and every one
trains the same number of steps (the time cap is lifted: a variant is never cut short by a busy machine). Each trained
model is evaluated as the pipeline evaluates it (`workflow.evaluate`: 500 heldout mazes, 100 of each shift
split, VisGym easy-64 and hard-64 in full) and compared with tiny-base by the pipeline's guarded gate
(`workflow.compare`, shipped guard settings). What is reported is success and loops, never the shaped
reward. Writes DIR/signals.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

# name -> GRPO config overrides on top of tiny-grpo (the reward terms are EnvConfig's, envs/maze_env.py)
VARIANTS: dict[str, dict[str, object]] = {
    "baseline": {},
    "revisit": {"env.revisit_penalty": 0.05},
    "dead-end": {"env.dead_end_exit_bonus": 0.1},
    "both": {"env.revisit_penalty": 0.05, "env.dead_end_exit_bonus": 0.1},
    "loop": {"env.loop_penalty": 0.3},
    "mazes-32": {"mazes_per_step": 32},
    # the lost phase played (and trained on) instead of cut at the moment the goal goes out of reach
    "play-lost": {"env.end_when_out_of_reach": False},
}
HELDOUT_MAZES, OTHER_MAZES = 500, 100  # the local profile's evaluation sizes


def variant_names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"--variants {text!r}: choose from {', '.join(VARIANTS)} (comma separated)")
    return names


def train_seeds(text: str) -> list[int]:
    try:
        seeds = [int(n) for n in text.split(",") if n.strip()]
    except ValueError:
        seeds = []
    if not seeds or any(s < 0 for s in seeds):
        raise argparse.ArgumentTypeError(f"--train-seeds {text!r}: give non-negative integers, comma separated")
    return seeds


def row(name: str, seed: int, comparison: dict, minutes: float, steps: int | None) -> dict:
    splits, decision = comparison["splits"], comparison["decision"]
    held, hard, easy = splits["heldout"], splits.get("visgym-hard-64", {}), splits.get("visgym-easy-64", {})
    return {"variant": name, "train_seed": seed, "overrides": VARIANTS[name], "train_minutes": round(minutes, 1), "steps": steps,
            "heldout_base": held["success_base"], "heldout_new": held["success_new"], "heldout_p": held["mcnemar_p"],
            "loop_base": held["loop_rate_base"], "loop_new": held["loop_rate_new"], "loop_p": held["loop_mcnemar_p"],
            "hard64_base": hard.get("success_base"), "hard64_new": hard.get("success_new"), "hard64_p": hard.get("mcnemar_p"),
            "hard64_loop_base": hard.get("loop_rate_base"), "hard64_loop_new": hard.get("loop_rate_new"),
            "easy64_new": easy.get("success_new"),
            "promoted": decision["improved"], "blocked_by": decision["blocked_by"], "undecided": decision["undecided"]}


def table(rows: list[dict]) -> str:
    lines = ["| variant | seed | heldout success | p | heldout loops | p | hard-64 success | hard-64 loops | easy-64 | gate |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        gate = "promoted" if r["promoted"] else "blocked by " + ", ".join(r["blocked_by"] or ["the main criterion"])
        lines.append(f"| {r['variant']} | {r['train_seed']} | {r['heldout_base']:.3f} -> {r['heldout_new']:.3f} | {r['heldout_p']:.2g} | "
                     f"{r['loop_base']:.3f} -> {r['loop_new']:.3f} | {r['loop_p']:.2g} | "
                     f"{r['hard64_base']:.3f} -> {r['hard64_new']:.3f} | {r['hard64_loop_base']:.3f} -> "
                     f"{r['hard64_loop_new']:.3f} | {r['easy64_new']:.3f} | {gate} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", type=variant_names, default=list(VARIANTS))
    ap.add_argument("--steps", type=int, default=120, help="GRPO steps per variant (tiny-grpo: 120)")
    ap.add_argument("--train-seeds", type=train_seeds, default=[1],
                    help="each variant is trained once per seed (comma separated): loops vary with the seed")
    ap.add_argument("--out", type=Path, default=Path("outputs/bench-signals"))
    args = ap.parse_args(argv)

    from mazerl.config import load_config
    from mazerl.mazes.splits import generate_dataset, preset
    from mazerl.mazes.visgym import reference_file
    from mazerl.rl.config import GRPOConfig
    from mazerl.rl.trainer import GRPOTrainer
    from mazerl.workflow import compare, evaluate

    out = args.out.resolve()
    mazes = out / "mazes"
    if not (mazes / "manifest.json").exists():
        generate_dataset(preset("default"), mazes, reference_file(), overwrite=True)
    base_eval = out / "eval-base"
    if not (base_eval / "summary.json").exists():
        evaluate("tiny-base", str(mazes), str(base_eval), HELDOUT_MAZES, OTHER_MAZES, config="tiny-grpo",
                 label="tiny-base")
    rows: list[dict] = []
    for name in args.variants:
        for seed in args.train_seeds:
            run = out / f"{name}-s{seed}"
            cfg = load_config(GRPOConfig, "tiny-grpo", {
                "policy.model": "tiny-base", "train_data": str(mazes / "train.parquet"),
                "eval_data": str(mazes / "heldout.parquet"), "output_dir": str(run / "grpo"), "steps": args.steps,
                "seed": seed, "eval_every": 0, "max_minutes": 120.0, **VARIANTS[name]})
            t0 = time.perf_counter()
            record = GRPOTrainer(cfg).run(resume="never", overwrite=True)
            minutes = (time.perf_counter() - t0) / 60
            evaluate(str(run / "grpo" / "final"), str(mazes), str(run / "eval"), HELDOUT_MAZES, OTHER_MAZES,
                     config="tiny-grpo", label=name)
            comparison = compare(str(base_eval), str(run / "eval"), str(run / "compare"), min_gain=0.0,
                                 max_p_value=0.05)
            rows.append(row(name, seed, comparison, minutes, record.get("step") if isinstance(record, dict) else None))
            print(table(rows[-1:]), flush=True)
            (out / "signals.json").write_text(json.dumps({"steps": args.steps, "train_seeds": args.train_seeds,
                                                          "variants": rows}, indent=2) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
