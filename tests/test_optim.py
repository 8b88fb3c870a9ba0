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


def test_moving_the_horizon_changes_the_next_rate_at_once_and_survives_a_checkpoint(tmp_path):
    from mazerl.rl.optim import set_schedule_horizon

    cfg = OptimConfig(lr=1e-3, schedule="cosine", min_lr_ratio=0.1)
    opt, sched = make_optimizer([torch.nn.Parameter(torch.zeros(2))], cfg, 100)
    for _ in range(10):
        opt.step()
        sched.step()
    assert sched.get_last_lr()[0] > 0.9e-3  # 10 of 100 steps: near the peak
    set_schedule_horizon(sched, 20)
    halfway = 1e-3 * (0.1 + 0.9 * 0.5)
    assert sched.get_last_lr()[0] == pytest.approx(halfway) and opt.param_groups[0]["lr"] == pytest.approx(halfway)
    torch.save(sched.state_dict(), tmp_path / "s.pt")
    opt2, sched2 = make_optimizer([torch.nn.Parameter(torch.zeros(2))], cfg, 100)
    sched2.load_state_dict(torch.load(tmp_path / "s.pt", weights_only=True))  # plain types: a checkpoint holds it
    for _ in range(10):
        opt2.step()
        sched2.step()
    assert sched2.get_last_lr()[0] == pytest.approx(1e-4)  # step 20 of the moved horizon: the floor


def test_steps_that_fit_is_where_a_deadline_stops_the_run():
    from mazerl.rl.driver import steps_that_fit

    # 10 s a step, 2 minutes, 3 steps done: ceil((120 - 30) / 10) = 9 more, the run ends near step 12
    assert steps_that_fit(step=3, steps=90, trained_seconds=30.0, steps_this_run=3, max_minutes=2.0) == 12
    assert steps_that_fit(step=3, steps=10, trained_seconds=30.0, steps_this_run=3, max_minutes=2.0) == 10  # steps first
    assert steps_that_fit(step=5, steps=90, trained_seconds=130.0, steps_this_run=5, max_minutes=2.0) == 6  # past it
    assert steps_that_fit(step=90, steps=90, trained_seconds=30.0, steps_this_run=90, max_minutes=2.0) == 90  # the end
    # after a resume the mean is this run's: 5 steps in 100 s (20 s each), 200 s left -> 10 more
    assert steps_that_fit(step=45, steps=90, trained_seconds=100.0, steps_this_run=5, max_minutes=5.0) == 55


def test_without_a_deadline_the_fitted_schedule_is_the_steps_own(tmp_path):
    # tiny-grpo fits its schedule to max_minutes; a run that drops the deadline (max_minutes: null, as the
    # cluster task tests do) is valid, and its horizon stays `steps`
    from mazerl.rl.driver import GRPODriver

    cfg = load_config(GRPOConfig, "tiny-grpo", {"train_data": "t.parquet", "output_dir": str(tmp_path), "max_minutes": None})
    assert cfg.fit_schedule_to_max_minutes and cfg.max_minutes is None

    class Driver(GRPODriver):
        def set_schedule_horizon(self, steps):
            raise AssertionError("no deadline: nothing to fit")

    driver = Driver()
    driver.cfg, driver.step = cfg, 5
    record = {"time/training_total": 1e6}
    driver.fit_schedule(record, 0)
    assert "lr_schedule_steps" not in record
