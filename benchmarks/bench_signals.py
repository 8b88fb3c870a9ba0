"""Training signals side by side: which of the critics' questions, put as training signal, changes what GRPO learns?

    python benchmarks/bench_signals.py [--variants baseline,no-loop-penalty,...] [--train-seeds 1,2,3] [--steps 120] [--out DIR]

Every variant is the shipped `tiny-grpo` job (the demo's GRPO) from the shipped tiny-base on the same
`default` dataset and the same train seeds, changed only by its overrides (VARIANTS below: a reward term, the
history the policy sees, a curriculum) or its train split (TRAIN_POOLS: mixed maze sizes), and every one
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
from pathlib import Path

# name -> GRPO config overrides on top of tiny-grpo (the reward terms are EnvConfig's, envs/maze_env.py)
VARIANTS: dict[str, dict[str, object]] = {
    "baseline": {},
    "no-loop-penalty": {"env.loop_penalty": 0.0},
    "revisit": {"env.revisit_penalty": 0.05},
    "dead-end": {"env.dead_end_exit_bonus": 0.1},
    "both": {"env.revisit_penalty": 0.05, "env.dead_end_exit_bonus": 0.1},
    "mazes-32": {"mazes_per_step": 32},
    # the lost phase played (and trained on) instead of cut at the moment the goal goes out of reach
    "play-lost": {"env.end_when_out_of_reach": False},
    # two earlier turns in every prompt (replies and feedback; the image of the current turn only)
    "history-2": {"policy.history": {"turns": 2, "images": 1}},
    # the mixed pool (TRAIN_POOLS), easy mazes first: a quarter of the pool (fewest optimal moves) at step 1
    "mixed-sizes": {},
    "mixed-curriculum": {"curriculum_start": 0.25},
    # a stronger loop penalty than tiny-grpo's 0.3
    "loop-1.0": {"env.loop_penalty": 1.0},
    # the mixed pool with that stronger penalty: 5x5 episodes loop in training, 4x4 ones hardly do
    "mixed-loop-1.0": {"env.loop_penalty": 1.0},
}
# pool name -> a train split some variants train on instead of the default preset's (same eval_seed: the evaluation
# splits are the very same files' mazes; the pool excludes their layouts as every train split does)
POOLS: dict[str, dict] = {
    # VisGym's two levels: easy (4x4) with its 18-turn limit, hard (5x5) with the default budget like hard-64's
    "mixed-sizes": {"count": 2000, "sizes": ["visgym-easy", "visgym-hard"], "max_turns": {"visgym-easy": 18}},
    # the same pool's 4x4 mazes and its first 222 5x5 ones (one in ten): a 5x5 episode costs ~13 4x4 ones here,
    # so an hour's steps stay mostly on the heldout size and still meet the larger one (bench_learning --train-pool)
    "mostly-4x4": {"count": {"visgym-easy": 2000, "visgym-hard": 222}, "sizes": ["visgym-easy", "visgym-hard"],
                   "max_turns": {"visgym-easy": 18}},
}
# variant -> its pool (generated once, in DIR/mazes-<pool>)
TRAIN_POOLS: dict[str, str] = {"mixed-sizes": "mixed-sizes", "mixed-curriculum": "mixed-sizes",
                               "mixed-loop-1.0": "mixed-sizes"}


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


def train_pool(name: str, mazes: Path, out: Path) -> Path:
    """Pool `name`'s train split, generated beside the default dataset with the same evaluation splits."""
    from mazerl.mazes.dataset_io import read_split
    from mazerl.mazes.splits import TRAIN_SPLIT, SplitSpec, generate_dataset, preset
    from mazerl.mazes.visgym import reference_file

    if not (out / "manifest.json").exists():
        cfg = preset("default")
        cfg.splits[TRAIN_SPLIT] = SplitSpec.model_validate(POOLS[name])
        generate_dataset(cfg, out, reference_file(), overwrite=True)
    ours, theirs = (json.loads((d / "manifest.json").read_text())["eval_splits_hash"] for d in (out, mazes))
    if ours != theirs:
        raise SystemExit(f"{out}: its evaluation splits differ from {mazes}'s: the variants would not be comparable")
    sizes = read_split(out / "train.parquet").height.value_counts().to_dict()
    print(f"{name}: train pool {out / 'train.parquet'}: grid sizes {sizes}", flush=True)
    return out / "train.parquet"


def training_minutes(metrics: list[dict]) -> float:
    """The whole run's training minutes: its steps' times summed (a resumed run's `time/training_total` counts
    from the resume only)."""
    return sum(r.get("time/step", 0.0) for r in metrics if r.get("step")) / 60


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

    import yaml

    from mazerl.atomic import write_text
    from mazerl.config import load_config
    from mazerl.metrics import read_metrics
    from mazerl.mazes.splits import generate_dataset, preset
    from mazerl.mazes.visgym import reference_file
    from mazerl.profiles import load_profile
    from mazerl.rl.config import GRPOConfig
    from mazerl.rl.trainer import GRPOTrainer
    from mazerl.workflow import compare, evaluate

    out = args.out.resolve()
    sizes = load_profile("local").pipeline  # what the demo evaluates
    heldout_mazes, other_mazes = sizes.eval_heldout_mazes, sizes.eval_other_mazes
    mazes = out / "mazes"
    if not (mazes / "manifest.json").exists():
        generate_dataset(preset("default"), mazes, reference_file(), overwrite=True)
    base_eval = out / "eval-base"
    if not (base_eval / "summary.json").exists():
        evaluate("tiny-base", str(mazes), str(base_eval), heldout_mazes, other_mazes, config="tiny-grpo",
                 label="tiny-base")
    # rows of earlier invocations with the same step count are kept (a variant and seed measured again replace theirs)
    record_file = out / "signals.json"
    earlier = json.loads(record_file.read_text()) if record_file.exists() else {}
    rows: list[dict] = earlier.get("variants", []) if earlier.get("steps") == args.steps else []
    for name in args.variants:
        for seed in args.train_seeds:
            run = out / f"{name}-s{seed}"
            train_data = mazes / "train.parquet"
            if name in TRAIN_POOLS:
                train_data = train_pool(TRAIN_POOLS[name], mazes, out / f"mazes-{TRAIN_POOLS[name]}")
            cfg = load_config(GRPOConfig, "tiny-grpo", {
                "policy.model": "tiny-base", "train_data": str(train_data),
                "eval_data": str(mazes / "heldout.parquet"), "output_dir": str(run / "grpo"), "steps": args.steps,
                "seed": seed, "eval_every": 0, "max_minutes": 120.0, **VARIANTS[name]})
            # resume="auto": an interrupted variant goes on from its last checkpoint, a finished one is not trained again
            GRPOTrainer(cfg).run(resume="auto", overwrite=True)
            metrics = read_metrics(run / "grpo" / "metrics.jsonl")
            # the job as the variant ran it: both models are shown the mazes as it shows them (its history, say)
            job = run / "job.yaml"
            write_text(job, yaml.safe_dump(cfg.model_dump(mode="json")))
            judge_base = base_eval
            if any(k.startswith("policy.") for k in VARIANTS[name]):
                judge_base = out / f"eval-base-{name}"
                if not (judge_base / "summary.json").exists():
                    evaluate("tiny-base", str(mazes), str(judge_base), heldout_mazes, other_mazes, config=str(job),
                             label="tiny-base")
            evaluate(str(run / "grpo" / "final"), str(mazes), str(run / "eval"), heldout_mazes, other_mazes,
                     config=str(job), label=name)
            comparison = compare(str(judge_base), str(run / "eval"), str(run / "compare"), min_gain=0.0,
                                 max_p_value=0.05)
            rows = [r for r in rows if (r["variant"], r["train_seed"]) != (name, seed)]
            rows.append(row(name, seed, comparison, training_minutes(metrics), metrics[-1]["step"]))
            print(table(rows[-1:]), flush=True)
            write_text(record_file, json.dumps({"steps": args.steps, "variants": rows}, indent=2) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
