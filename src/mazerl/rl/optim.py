"""AdamW with linear warm-up then a constant or cosine learning rate."""

from __future__ import annotations

import math

import torch

from ..errors import UserError
from .config import OptimConfig


def make_optimizer(params, cfg: OptimConfig, total_steps: int):
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)

    def factor(step: int) -> float:
        if cfg.warmup_steps and step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.schedule == "constant":
            return 1.0
        span = max(1, total_steps - cfg.warmup_steps)
        progress = min(1.0, (step - cfg.warmup_steps) / span)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


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
