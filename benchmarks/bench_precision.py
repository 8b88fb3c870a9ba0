"""What `autocast: bfloat16` buys a GRPO step, and what it costs in log-probability agreement.

tiny-grpo's own steps from tiny-base on the `default` preset's train split, in float32 and under
bf16 autocast, in alternating blocks within one run (so a machine's slow minute hits both). Per
mode: median rollout and update seconds. Then, on one step's samples, how far the bf16 engine's
log-probabilities of the sampled moves are from float32's (the update's ratio starts at exp(gap)).

Usage: python benchmarks/bench_precision.py [--mazes DIR] [--steps-per-block 4] [--blocks 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from mazerl.atomic import write_json
from mazerl.config import load_config
from mazerl.rl.config import GRPOConfig
from mazerl.rl.logprobs import token_logprobs
from mazerl.rl.trainer import GRPOTrainer


def timed_steps(cfg: GRPOConfig, steps: int) -> list[dict]:
    """`steps` GRPO steps (collect + update + sync), each step's rollout and update seconds."""
    trainer = GRPOTrainer(cfg)
    rows = []
    for _ in range(steps):
        t0 = time.perf_counter()
        trajs = trainer.collect()
        t1 = time.perf_counter()
        trainer.update(trajs)
        trainer.step += 1
        trainer.sync_weights()
        rows.append({"rollout_s": t1 - t0, "update_s": time.perf_counter() - t1})
    return rows


def logprob_gap(cfg: GRPOConfig) -> dict:
    """One step's sampled moves under bf16 autocast: their log-probabilities vs float32's."""
    trainer = GRPOTrainer(cfg)
    [batch], _ = trainer.mini_batches(trainer.collect())
    sampled = torch.tensor([lp for s in batch.samples for lp, m in zip(s.old_logprobs, s.loss_mask) if m])
    with torch.no_grad():
        fp32 = token_logprobs(trainer.model, trainer.chat, batch.samples, trainer.tp.sampling(temperature=cfg.temperature),
                              False, trainer.tp.reply_choices).logprobs
    gap = (sampled - fp32).abs()
    return {"moves": len(gap), "median": float(gap.median()), "p99": float(gap.quantile(0.99)), "max": float(gap.max()),
            "share_outside_clip": float(((gap.exp() - 1) > cfg.clip_low).float().mean())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mazes", type=Path, help="dataset directory (default: generate the default preset in a temp dir)")
    ap.add_argument("--steps-per-block", type=int, default=4)
    ap.add_argument("--blocks", type=int, default=2, help="blocks per mode, alternating float32 / bf16")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        mazes = args.mazes
        if mazes is None:
            from mazerl.mazes.splits import generate_dataset, preset
            from mazerl.mazes.visgym import reference_file

            mazes = Path(tmp) / "mazes"
            generate_dataset(preset("default"), mazes, reference_file(), overwrite=True)

        def config(autocast: str, block: int) -> GRPOConfig:
            return load_config(GRPOConfig, "tiny-grpo", {
                "train_data": str(mazes / "train.parquet"), "eval_data": None, "eval_every": 0,
                "output_dir": str(Path(tmp) / f"{autocast}-{block}"), "autocast": autocast, "seed": block,
                "steps": args.steps_per_block, "checkpoint_every": 10_000})

        timings: dict[str, list[dict]] = {"off": [], "bfloat16": []}
        for block in range(args.blocks):
            for mode in ("off", "bfloat16"):
                rows = timed_steps(config(mode, block), args.steps_per_block)
                timings[mode] += rows[1:]  # a trainer's first step warms its caches
                print(f"block {block} {mode}: " + ", ".join(f"{r['rollout_s']:.1f}+{r['update_s']:.1f} s" for r in rows), flush=True)
        gap = logprob_gap(config("bfloat16", 99))

    def medians(rows: list[dict]) -> dict:
        roll, upd = statistics.median(r["rollout_s"] for r in rows), statistics.median(r["update_s"] for r in rows)
        return {"steps": len(rows), "rollout_s": roll, "update_s": upd, "step_s": roll + upd}

    result = {"float32": medians(timings["off"]), "bfloat16_autocast": medians(timings["bfloat16"]), "logprob_gap": gap,
              "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    f, b = result["float32"], result["bfloat16_autocast"]
    result["speedup"] = {k: f[k] / b[k] for k in ("rollout_s", "update_s", "step_s")}
    for name, r in (("float32", f), ("bf16 autocast", b)):
        print(f"{name:14s} rollout {r['rollout_s']:.2f} s  update {r['update_s']:.2f} s  step {r['step_s']:.2f} s  ({r['steps']} steps)")
    print("speedup " + "  ".join(f"{k[:-2]} {v:.2f}x" for k, v in result["speedup"].items()))
    print(f"|log p bf16 - log p float32| over {gap['moves']} sampled moves: median {gap['median']:.2e}, "
          f"p99 {gap['p99']:.2e}, max {gap['max']:.2e}; outside the clip range: {gap['share_outside_clip']:.3%}")
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
