"""What sharing one forward pass between equal inputs saves a GRPO step (`rl/logprobs.shared_inputs`,
the engine's identical-request sharing).

tiny-grpo's steps from tiny-base on the `default` preset's train split. For each step, in one run and
on the same weights: the rollout with the engine's sharing on and off (same seeds, so the same
episodes up to float rounding), then the update's forward and backward passes over the step's
mini-batch with the trainer's sharing on and off (the gradient is not applied, so both see the same
weights; the step then trains once, as GRPO does). Reports median seconds of each, their ratio, and
how many distinct inputs the samples and requests had.

Usage: python benchmarks/bench_shared_prefixes.py [--mazes DIR] [--steps 4] [--json FILE]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from mazerl.atomic import write_json
from mazerl.config import load_config
from mazerl.rl.config import GRPOConfig
from mazerl.rl.logprobs import shared_inputs, token_logprobs
from mazerl.rl.precision import mixed_precision
from mazerl.rl.trainer import GRPOTrainer


def forward_backward_seconds(trainer: GRPOTrainer, samples, share: bool) -> float:
    """The update's passes over `samples` in tiny-grpo's micro-batches, gradients discarded."""
    cfg, worker = trainer.cfg, trainer.worker
    sampling = trainer.tp.sampling(temperature=cfg.temperature)
    t0 = time.perf_counter()
    for start in range(0, len(samples), cfg.micro_batch):
        with mixed_precision(cfg.autocast, cfg.policy.device):
            tl = token_logprobs(trainer.model, trainer.chat, samples[start:start + cfg.micro_batch], sampling,
                                allowed_ids=worker.choices, share_prefixes=share)
        tl.logprobs.sum().backward()
    trainer.model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mazes", type=Path, default=Path("outputs/demo/mazes"), help="a `default` preset dataset")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(GRPOConfig, "tiny-grpo", {"train_data": str(args.mazes / "train.parquet"), "eval_data": None,
                                                    "output_dir": tmp, "max_minutes": None})
        trainer = GRPOTrainer(cfg)
        engine = trainer.tp.engine
        rows = []
        for step in range(args.steps):
            state = trainer.sampler.state_dict()
            times = {}
            for share in (False, True):  # the same mazes and seeds for both
                trainer.sampler.load_state_dict(state)
                engine.share_identical_requests = share
                t0 = time.perf_counter()
                trajs = trainer.collect()
                times[share] = time.perf_counter() - t0
            requests = sum(t.stats.turns for t in trajs)
            batches, _ = trainer.mini_batches(trajs)
            samples = [s for b in batches for s in b.samples]
            distinct = sum(len(shared_inputs(samples[i:i + cfg.micro_batch], trainer.chat.image_pad)[0])
                           for i in range(0, len(samples), cfg.micro_batch))
            fb = {share: forward_backward_seconds(trainer, samples, share) for share in (False, True)}
            trainer.update(trajs)
            trainer.step += 1
            trainer.sync_weights()
            row = {"step": step + 1, "requests": requests, "update_samples": len(samples), "update_inputs": distinct,
                   "rollout_s_alone": times[False], "rollout_s_shared": times[True],
                   "update_fb_s_alone": fb[False], "update_fb_s_shared": fb[True]}
            rows.append(row)
            print({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}, flush=True)

    def med(key):
        return statistics.median(r[key] for r in rows)

    summary = {
        "steps": len(rows), "autocast": cfg.autocast,
        "rollout_s_alone": med("rollout_s_alone"), "rollout_s_shared": med("rollout_s_shared"),
        "rollout_speedup": med("rollout_s_alone") / med("rollout_s_shared"),
        "update_fb_s_alone": med("update_fb_s_alone"), "update_fb_s_shared": med("update_fb_s_shared"),
        "update_speedup": med("update_fb_s_alone") / med("update_fb_s_shared"),
        "update_inputs_per_sample": sum(r["update_inputs"] for r in rows) / max(1, sum(r["update_samples"] for r in rows)),
        "rows": rows,
    }
    print({k: round(v, 3) if isinstance(v, float) else v for k, v in summary.items() if k != "rows"})
    if args.json:
        write_json(args.json, summary)


if __name__ == "__main__":
    main()
