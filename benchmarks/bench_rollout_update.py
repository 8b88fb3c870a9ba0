"""Rollout and update speed, and memory, side by side in one run (tiny model, CPU).

1. Rollout: the same mazes played by the batched multi-turn loop vs one episode at a time, same
   engine, same model (episodes/s).
2. Update: one GRPO optimizer step at equal batch, model and lengths (single turn: an image prompt,
   8 new tokens, 8 samples): mazerl's rollout + update vs TRL's `GRPOTrainer` step.
3. Memory: peak RSS while rolling out and while updating (sampled every 10 ms).

Usage: python benchmarks/bench_rollout_update.py [--model DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
import warnings
from pathlib import Path

import psutil

from mazerl.atomic import write_json
from mazerl.mazes.splits import DatasetConfig, generate_dataset
from mazerl.policy.tiny import init_tiny
from mazerl.rollout.factory import open_policy
from mazerl.policy.config import PolicyConfig
from mazerl.rl.config import GRPOConfig
from mazerl.rl.trainer import GRPOTrainer
from mazerl.rollout.engine import SamplingParams
from mazerl.rollout.multiturn import HistoryConfig, items_from_split, rollout
from mazerl.mazes.dataset_io import read_split

POLICY = dict(history=HistoryConfig(turns=0, images=1), render_scale=1.28, max_new_tokens=8, prompt="short")


class PeakRSS:
    """Peak resident memory of this process while the block runs."""

    def __enter__(self):
        self.proc = psutil.Process()
        self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._poll, daemon=True)
        self._t.start()
        return self

    def _poll(self):
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak_mb = self.peak / 2**20


def bench_rollout(model: str, split: Path, n: int, max_turns: int) -> dict:
    tp = open_policy(PolicyConfig(model=model, **POLICY))
    items = items_from_split(read_split(split), range(n), 1.28, max_turns)
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=0, banned_ids=tuple(tp.chat.banned_reply_ids))
    rollout(tp.engine, tp.chat, items[:2], sampling=params, history=POLICY["history"])  # warm-up
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        batched = rollout(tp.engine, tp.chat, items, sampling=params, history=POLICY["history"])
        t_batched = time.perf_counter() - t0
    t0 = time.perf_counter()
    single = [rollout(tp.engine, tp.chat, [it], sampling=params, history=POLICY["history"])[0] for it in items]
    t_single = time.perf_counter() - t0
    turns = sum(t.stats.turns for t in batched)
    return {
        "episodes": n, "turns": turns, "turns_one_at_a_time": sum(t.stats.turns for t in single),
        "batched_episodes_per_s": n / t_batched, "one_at_a_time_episodes_per_s": n / t_single,
        "ratio": t_single / t_batched, "batched_turns_per_s": turns / t_batched, "rollout_peak_rss_mb": mem.peak_mb,
    }


def bench_ours(model: str, data: Path, out: Path, steps: int) -> dict:
    cfg = GRPOConfig(
        policy=PolicyConfig(model=model, **POLICY), train_data=str(data), output_dir=str(out), steps=steps,
        mazes_per_step=1, group_size=8, micro_batch=8, max_turns=1, filter_zero_variance_groups=False,
        eval_every=0, checkpoint_every=10_000, seed=0,
    )
    trainer = GRPOTrainer(cfg)
    times, upd, peaks = [], [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        trajs = trainer.collect()
        t1 = time.perf_counter()
        with PeakRSS() as mem:
            trainer.update(trajs)
        trainer.step += 1
        trainer.sync_weights()  # as the real loop does: the next rollout is tagged with the new version
        t2 = time.perf_counter()
        times.append(t2 - t0)
        upd.append(t2 - t1)
        peaks.append(mem.peak_mb)
    lengths = [len(s.ids) for t in trajs for s in t.samples()]
    return {"step_s": statistics.median(times[2:]), "update_only_s": statistics.median(upd[2:]),
            "sequence_tokens": statistics.median(lengths), "update_peak_rss_mb": max(peaks)}


def bench_trl(model: str, data: Path, steps: int) -> dict:
    import random

    from datasets import Dataset
    from PIL import Image
    from transformers import AutoProcessor, TrainerCallback
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    from mazerl.mazes.dataset_io import row_render_options, row_to_maze
    from mazerl.mazes.render import render_rgb
    from mazerl.policy.prompts import SHORT_SYSTEM_PROMPT, turn_text

    df = read_split(data)
    rows = []
    for i in range(16):
        row = df.iloc[i]
        maze = row_to_maze(row)
        opts = row_render_options(row).model_copy(update={"square_px": 32})
        rows.append({
            "prompt": [
                {"role": "system", "content": [{"type": "text", "text": SHORT_SYSTEM_PROMPT}]},
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": turn_text("", 1, 18)}]},
            ],
            "image": Image.fromarray(render_rgb(maze.grid, maze.start, maze.goal, opts)),
        })
    rng = random.Random(0)
    stamps: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            stamps.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as tmp:
        args = TRLConfig(
            output_dir=tmp, per_device_train_batch_size=8, num_generations=8, max_completion_length=8,
            max_steps=steps, learning_rate=1e-6, use_cpu=True, report_to=[], logging_steps=10_000,
            save_strategy="no", beta=0.0, temperature=1.0, dataloader_num_workers=0, seed=0,
            # Same numerics and work as ours: fp32, no activation recomputation (TRL defaults to
            # bf16 autocast and gradient checkpointing, which on CPU cost ~20x in the backward pass).
            bf16=False, fp16=False, gradient_checkpointing=False,
        )
        trainer = TRLTrainer(
            model=model, reward_funcs=lambda completions, **kw: [rng.random() for _ in completions],
            args=args, train_dataset=Dataset.from_list(rows), processing_class=AutoProcessor.from_pretrained(model),
            callbacks=[Clock()],
        )
        start = time.perf_counter()
        trainer.train()
    gaps = [b - a for a, b in zip([start, *stamps], stamps)]
    return {"step_s": statistics.median(gaps[2:]), "steps": len(gaps)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model directory (default: a fresh tiny model)")
    ap.add_argument("--rollout-mazes", type=int, default=32)
    ap.add_argument("--rollout-turns", type=int, default=6)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--json")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = args.model or str(init_tiny(tmp / "tiny"))
        cfg = DatasetConfig.model_validate({"reference_splits": {}, "splits": {"train": {"count": 64}}})
        generate_dataset(cfg, tmp / "mazes")
        data = tmp / "mazes" / "train.parquet"
        results = {"rollout": bench_rollout(model, data, args.rollout_mazes, args.rollout_turns)}
        ours = bench_ours(model, data, tmp / "ours", args.steps)
        trl = bench_trl(model, data, args.steps)
        results["update"] = {
            "mazerl": ours, "trl": trl,
            "ratio_step_mazerl_over_trl": ours["step_s"] / trl["step_s"],
            "ratio_update_only_mazerl_over_trl_step": ours["update_only_s"] / trl["step_s"],
        }
    print(json.dumps(results, indent=2))
    if args.json:
        write_json(args.json, results)


if __name__ == "__main__":
    main()
