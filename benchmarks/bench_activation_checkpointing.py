"""What activation checkpointing (`distributed.activation_checkpointing`) saves in peak memory, and what it
costs in update time, on long multi-image samples: whole 18-turn episodes with full history (18 images
each), `--micro-batch` of them in one forward/backward.

Each mode runs in a fresh process, so that their peaks do not mix: the policy opened for training the
way the shipped 8B config opens it (its settings, with `--model` on this machine's device: float32
master weights, bf16 compute, the KL anchor), then `--steps` updates on the same mini-batch. The first
update allocates AdamW's state, so the figures are those of the later ones: the peak memory above what
was in use just before the update, and the median update time. Peak memory: on a GPU
torch.cuda.max_memory_allocated; on the CPU the process's RSS sampled every millisecond (glibc's mmap
threshold fixed at 64 KiB, so that a freed tensor leaves the RSS at once).

Usage: python benchmarks/bench_activation_checkpointing.py [--model tiny-base] [--micro-batch 4] [--turns 18]
       [--steps 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

CONFIG = "qwen3vl-8b-grpo"


class PeakRSS:
    """The highest RSS of this process while inside the `with` block, sampled every millisecond."""

    def __enter__(self):
        import psutil

        self._proc, self.peak, self._stop = psutil.Process(), 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            time.sleep(0.001)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)


def episodes_batch(tp, mazes: Path, count: int, turns: int):
    """`count` whole episodes of `turns` random moves (on 8x8 mazes: rarely at the goal early), full history: one sample
    each, every turn's reply a loss token span, fixed random advantages."""
    from mazerl.envs.agents import as_reply, random_action
    from mazerl.envs.maze_env import EnvConfig
    from mazerl.mazes.dataset_io import read_split
    from mazerl.rl.worker import MiniBatch
    from mazerl.rollout.multiturn import items_from_split, rollout

    df = read_split(mazes / "train.parquet")
    items = items_from_split(df, range(count), tp.config.render_scale, max_turns=turns)
    rng = random.Random(0)
    env = EnvConfig().model_copy(update={"end_when_out_of_reach": False})

    def wander(e):  # a random move that is not `stop` (which would end the episode)
        while (move := random_action(e, rng)) == "stop":
            pass
        return as_reply(move), True

    trajs = rollout(None, tp.chat, items, teacher=wander, env_config=env, history=tp.config.history, sampling=tp.sampling())
    samples = [s for t in trajs for s in t.samples()]
    if len(samples) != count:
        raise RuntimeError(f"expected one sample per episode (full history), got {len(samples)} for {count} episodes")
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([s.n_loss_tokens for s in samples])
    return MiniBatch(samples=samples, episode=list(range(count)),
                     token_advantages=[torch.randn(s.n_loss_tokens, generator=gen) for s in samples],
                     tokens=int(lengths.sum()), episodes=count, episode_tokens=lengths)


def measure(args, checkpointing: bool) -> dict:
    """One mode, in this process."""
    from mazerl.config import load_config
    from mazerl.rollout.factory import open_policy
    from mazerl.rl.config import GRPOConfig
    from mazerl.rl.worker import PolicyWorker

    gpu = torch.cuda.is_available()
    cfg = load_config(GRPOConfig, CONFIG, {
        "policy.model": args.model, "policy.device": "cuda" if gpu else "cpu", "train_data": "unused", "output_dir": "unused",
        "micro_batch": args.micro_batch, "distributed.activation_checkpointing": checkpointing})
    torch.manual_seed(0)
    tp = open_policy(cfg.policy, cfg.lora, with_engine=False, for_training=True, activation_checkpointing=checkpointing)
    worker = PolicyWorker(tp.policy.model, tp.chat, tp.reply_choices, cfg, total_optimizer_steps=args.steps)
    batch = episodes_batch(tp, Path(args.mazes), args.micro_batch, args.turns)
    sampling = tp.sampling(temperature=cfg.temperature)
    worker.rescore_old_logprobs([batch], sampling)
    peaks, seconds, losses = [], [], []
    for step in range(1, args.steps + 1):
        if gpu:
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            out = worker.train_step(batch, sampling, step)
            torch.cuda.synchronize()
            seconds.append(time.perf_counter() - t0)
            peaks.append(torch.cuda.max_memory_allocated() - before)
        else:
            import psutil

            before = psutil.Process().memory_info().rss
            with PeakRSS() as rss:
                t0 = time.perf_counter()
                out = worker.train_step(batch, sampling, step)
                seconds.append(time.perf_counter() - t0)
            peaks.append(rss.peak - before)
        losses.append(out["loss"])
    later = slice(1, None) if args.steps > 1 else slice(None)
    return {"activation_checkpointing": checkpointing, "peak_mib": max(peaks[later]) / 2**20,
            "update_s": statistics.median(seconds[later]), "first_loss": losses[0], "steps": args.steps,
            "samples": len(batch.samples), "tokens_per_sample": [len(s.ids) for s in batch.samples],
            "images_per_sample": [len(s.images) for s in batch.samples],
            "device": torch.cuda.get_device_name() if gpu else f"cpu ({torch.get_num_threads()} threads)"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-base")
    ap.add_argument("--micro-batch", type=int, default=4, help="episodes in the one forward/backward")
    ap.add_argument("--turns", type=int, default=18, help="turns (and images) per episode")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--mazes", help=argparse.SUPPRESS)  # set for the child processes
    ap.add_argument("--child", choices=["on", "off"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args, args.child == "on")))
        return

    from mazerl.mazes.splits import DatasetConfig, generate_dataset

    with tempfile.TemporaryDirectory() as tmp:
        mazes = Path(tmp) / "mazes"
        generate_dataset(DatasetConfig.model_validate({"reference_splits": {}, "splits": {
            "heldout": {"count": 4}, "train": {"count": args.micro_batch, "sizes": ["8x8"]}}}), mazes)  # random play rarely ends early
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
        results = {}
        for mode in ("off", "on"):
            cmd = [sys.executable, __file__, "--child", mode, "--mazes", str(mazes), "--model", args.model,
                   "--micro-batch", str(args.micro_batch), "--turns", str(args.turns), "--steps", str(args.steps)]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if done.returncode:
                sys.exit(f"the {mode} run failed:\n{done.stderr[-3000:]}")
            results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    off, on = results["off"], results["on"]
    summary = {"off": off, "on": on, "peak_saved": 1 - on["peak_mib"] / off["peak_mib"],
               "update_time_ratio": on["update_s"] / off["update_s"], "same_first_loss": on["first_loss"] == off["first_loss"]}
    print(f"{off['samples']} samples of {off['tokens_per_sample']} tokens, {off['images_per_sample']} images; {off['device']}")
    for name, r in (("without", off), ("with", on)):
        print(f"{name:8s} checkpointing: peak {r['peak_mib']:.0f} MiB above the weights and optimizer state, "
              f"update {r['update_s']:.2f} s (median of {r['steps'] - 1})")
    print(f"peak memory saved: {summary['peak_saved']:.0%}; update time x{summary['update_time_ratio']:.2f}; "
          f"first update's loss identical: {summary['same_first_loss']}")
    if args.json:
        from mazerl.atomic import write_json

        write_json(args.json, summary)


if __name__ == "__main__":
    main()
