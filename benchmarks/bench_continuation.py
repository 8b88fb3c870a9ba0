"""Does a second round gain when it continues the first round's run instead of restarting from its weights?

Scheduled retraining starts each round from the last promoted model's weights with a fresh optimizer and a
learning-rate schedule that starts again at its peak; measured that way, rounds after the first gained nothing
significant (docs/BENCHMARKS.md, "Retraining"), while one continuous run kept gaining where the rounds stopped
("GRPO learning: the hour"). This script continues a finished GRPO run from its last checkpoint, with its AdamW
state, its walk through the train split and its learning-rate schedule, the schedule's end moved `--steps`
further (cosine from where the run stood back down to its floor), then evaluates both models as the pipeline
does and judges the continuation against the run's own final model with the guarded gate.

Usage (round 1 of a `bench_retraining.py` run: its train-grpo task directory):
  python benchmarks/bench_continuation.py --run RUNS/mazerl-.../train-grpo --steps 215 \\
      --mazes DIR/mazes --out outputs/bench-continuation

`--run` is read, never written: its checkpoints are copied into OUT/grpo and the continuation resumes there.
Writes OUT/continuation.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from bench_learning import pipeline_gate  # the pipeline's evaluation and guarded gate, as the hour uses them
from mazerl.atomic import write_json
from mazerl.config import load_config
from mazerl.metrics import read_metrics
from mazerl.rl.config import GRPOConfig
from mazerl.rl.trainer import GRPOTrainer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, required=True, help="a pipeline train-grpo task directory (its trained/ run)")
    ap.add_argument("--steps", type=int, required=True, help="GRPO steps to add")
    ap.add_argument("--mazes", type=Path, required=True, help="dataset directory with the frozen evaluation splits")
    ap.add_argument("--grpo-config", default="tiny-grpo-retrain", help="the job config the run was trained with")
    ap.add_argument("--out", type=Path, default=Path("outputs/bench-continuation"))
    args = ap.parse_args()
    trained = args.run / "trained"
    if args.steps < 1:
        ap.error(f"--steps {args.steps}: give 1 or more")
    if not (trained / "checkpoints").is_dir() or not (args.run.parent / "generate-mazes" / "mazes").is_dir():
        ap.error(f"--run {args.run}: not a pipeline train-grpo task directory (trained/checkpoints and the run's "
                 "generate-mazes/mazes beside it)")
    if args.out.exists():
        ap.error(f"--out {args.out} exists: give a new directory")

    data = args.run.parent / "generate-mazes" / "mazes"
    first = [r for r in read_metrics(trained / "metrics.jsonl") if r.get("step")]
    done = first[-1]["step"]
    shutil.copytree(trained / "checkpoints", args.out / "grpo" / "checkpoints", symlinks=True)
    shutil.copy2(trained / "metrics.jsonl", args.out / "grpo" / "metrics.jsonl")
    cfg = load_config(GRPOConfig, args.grpo_config, {
        "train_data": str(data / "train.parquet"), "eval_data": str(data / "heldout.parquet"),
        "output_dir": str(args.out / "grpo"), "steps": done + args.steps, "max_minutes": None,
        "fit_schedule_to_max_minutes": False, "eval_every": 0, "eval_every_minutes": None,
    })
    trainer = GRPOTrainer(cfg, on_step=lambda s, r: print(
        f"step {s}: success {r['success_rate']:.3f} lr {r['lr']:.2e} grad norm {r['grad_norm']:.2f}", flush=True))
    resume = trainer.resume

    def resume_with_a_longer_schedule(*a, **k):
        step = resume(*a, **k)
        trainer.set_schedule_horizon(cfg.steps)  # the checkpoint's schedule ended at `done`: end it later
        return step

    trainer.resume = resume_with_a_longer_schedule
    t0 = time.perf_counter()
    last = trainer.run(resume="auto")
    minutes = (time.perf_counter() - t0) / 60
    added = [r for r in read_metrics(args.out / "grpo" / "metrics.jsonl") if r.get("step", 0) > done]
    result = {
        "run": str(args.run), "resumed_at_step": done, "steps_added": args.steps, "final_step": last.get("step"),
        "lr_first": added[0]["lr"], "lr_last": added[-1]["lr"], "training_minutes": minutes,
        "sampled_success_first_20": sum(r["success_rate"] for r in added[:20]) / len(added[:20]),
        "sampled_success_last_20": sum(r["success_rate"] for r in added[-20:]) / len(added[-20:]),
        "gate": pipeline_gate(str(trained / "final"), args.out / "grpo" / "final", args.mazes, args.out,
                              args.grpo_config),
    }
    write_json(args.out / "continuation.json", result)
    print(json.dumps({k: v for k, v in result.items() if k != "gate"}, indent=2))


if __name__ == "__main__":
    main()
