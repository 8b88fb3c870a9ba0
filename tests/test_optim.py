"""The learning-rate schedule GRPO and behaviour cloning share (rl/optim.py)."""

import math

import pytest
import torch

from mazerl.config import load_config
from mazerl.rl.config import GRPOConfig, OptimConfig
from mazerl.rl.optim import make_optimizer


def lrs(cfg: OptimConfig, total: int, steps: int) -> list[float]:
    opt, sched = make_optimizer([torch.nn.Parameter(torch.zeros(2))], cfg, total)
    out = []
    for _ in range(steps):
        out.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return out


def test_cosine_decays_from_the_peak_to_its_floor_over_the_run_and_stays_there():
    cfg = OptimConfig(lr=2e-4, schedule="cosine", min_lr_ratio=0.1)
    got = lrs(cfg, total=60, steps=70)
    assert got[0] == pytest.approx(2e-4)
    assert got[30] == pytest.approx(2e-4 * (0.1 + 0.9 * 0.5))  # halfway: midway between peak and floor
    assert got[60] == pytest.approx(2e-5) and got[69] == pytest.approx(2e-5)  # past the horizon: the floor
    assert all(a > b for a, b in zip(got[:61], got[1:61]))  # strictly decreasing until then


def test_warmup_rises_linearly_then_the_cosine_starts_at_the_peak():
    cfg = OptimConfig(lr=1e-3, schedule="cosine", warmup_steps=4, min_lr_ratio=0.0)
    got = lrs(cfg, total=14, steps=15)
    assert got[:4] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert got[4] == pytest.approx(1e-3)
    assert got[9] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert got[14] == pytest.approx(0.0, abs=1e-12)


def test_constant_schedule_never_changes():
    assert set(lrs(OptimConfig(lr=3e-4), total=5, steps=8)) == {3e-4}


def test_tiny_grpo_decays_over_its_own_steps(tmp_path):
    # the shipped GRPO config: its schedule's horizon is `steps`, which a run (or the pipeline's
    # grpo_steps) may override; max_minutes only stops a slower machine early
    cfg = load_config(GRPOConfig, "tiny-grpo", {"train_data": "t.parquet", "output_dir": str(tmp_path)})
    assert cfg.optim.schedule == "cosine" and cfg.max_minutes is not None
    got = lrs(cfg.optim, total=cfg.steps, steps=cfg.steps + 1)
    assert got[0] == pytest.approx(cfg.optim.lr) and got[-1] == pytest.approx(cfg.optim.lr * cfg.optim.min_lr_ratio)
