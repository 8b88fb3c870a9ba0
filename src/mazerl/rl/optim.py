"""AdamW with linear warm-up then a constant or cosine learning rate."""

from __future__ import annotations

import math

import torch

from ..errors import UserError
from .config import OptimConfig


class LRFactor:
    """The learning rate as a fraction of `lr` after `step` optimizer steps: linear warm-up, then constant
    or cosine down to `min_lr_ratio` at `total_steps`. An object with plain attributes, not a closure, so
    that LambdaLR's state_dict carries it (a horizon moved by `set_schedule_horizon` survives a resume)."""

    def __init__(self, cfg: OptimConfig, total_steps: int):
        self.warmup_steps, self.schedule, self.min_lr_ratio = cfg.warmup_steps, cfg.schedule, cfg.min_lr_ratio
        self.total_steps = int(total_steps)

    def __call__(self, step: int) -> float:
        if self.warmup_steps and step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.schedule == "constant":
            return 1.0
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(params, cfg: OptimConfig, total_steps: int):
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, LRFactor(cfg, total_steps))


def set_schedule_horizon(scheduler: torch.optim.lr_scheduler.LambdaLR, total_steps: int) -> None:
    """Move the schedule's end to `total_steps` optimizer steps; the next step already uses the new rate."""
    factor = scheduler.lr_lambdas[0]
    factor.total_steps = int(total_steps)
    lrs = [base * factor(scheduler.last_epoch) for base in scheduler.base_lrs]
    for group, lr in zip(scheduler.optimizer.param_groups, lrs):
        group["lr"] = lr
    scheduler._last_lr = lrs  # what get_last_lr() reports


class NonFiniteError(UserError):
    """A loss or gradient that is NaN or infinite: the step is refused before the weights change."""


def clip_and_check(params, max_norm: float, step: int, lr: float) -> float:
    """Clip gradients to `max_norm` and return their norm before clipping; raise NonFiniteError (the
    optimizer not yet stepped, nothing saved) when any gradient is NaN or infinite."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # a DTensor under FSDP2
    if not math.isfinite(norm):
        raise NonFiniteError(f"step {step}: the gradient norm is {norm}; the update was refused before it touched the "
                             f"weights and nothing was saved. Lower optim.lr (now {lr:g}) or check the inputs")
    return norm


def check_loss(loss: torch.Tensor, step: int, lr: float) -> None:
    value = float(loss.detach())
    if not math.isfinite(value):
        raise NonFiniteError(f"step {step}: the loss is {value}; the update was refused before it touched the weights "
                             f"and nothing was saved. Lower optim.lr (now {lr:g}) or check the inputs")
