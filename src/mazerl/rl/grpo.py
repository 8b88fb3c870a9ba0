"""GRPO: group-normalised advantages and the clipped policy-gradient loss (with optional k3 KL).

Shapes: every per-token tensor is flat, (T,) over the loss tokens of a micro-batch; `seq_index`
says which sequence (episode) each token belongs to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Aggregation = Literal["token-mean", "seq-mean"]


def group_advantages(rewards: torch.Tensor, groups: torch.Tensor, scale_by_std: bool = True, eps: float = 1e-6):
    """A_i = (r_i - mean_g) / (std_g + eps), or r_i - mean_g without std scaling (Dr. GRPO).

    Returns (advantages, zero_variance) where zero_variance[i] is True when every member of i's
    group got the same reward (no learning signal: dynamic sampling drops those groups).
    """
    rewards = rewards.double()
    adv = torch.zeros_like(rewards)
    zero_var = torch.zeros_like(rewards, dtype=torch.bool)
    for g in torch.unique(groups):
        idx = groups == g
        r = rewards[idx]
        centred = r - r.mean()
        std = r.std(unbiased=False) if r.numel() > 1 else torch.zeros((), dtype=r.dtype)
        adv[idx] = centred / (std + eps) if scale_by_std else centred
        zero_var[idx] = bool((r.max() - r.min()).abs() < 1e-12)
    return adv.float(), zero_var


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || ref): exp(ref - logp) - (ref - logp) - 1 >= 0."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


@dataclass
class LossStats:
    clip_fraction: float
    ratio_mean: float
    kl: float
    pg_loss: float


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    seq_index: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    aggregation: Aggregation = "token-mean",
    token_normaliser: float | None = None,
    seq_normaliser: float | None = None,
    seq_lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """PPO-clip surrogate per token, aggregated over the whole mini-batch.

    For gradient accumulation pass the mini-batch totals: `token_normaliser` (all loss tokens)
    for token-mean; `seq_normaliser` (sequences) and `seq_lengths` (tokens per sequence id, full
    length even when a sequence is split over micro-batches) for seq-mean.
    """
    ratio = torch.exp(logp - old_logp)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    pg = per_token
    kl = torch.zeros_like(logp)
    if ref_logp is not None and kl_coef > 0:
        kl = k3_kl(logp, ref_logp)
        per_token = per_token + kl_coef * kl
    if aggregation == "token-mean":
        denom = token_normaliser if token_normaliser is not None else float(per_token.numel())
        loss = per_token.sum() / max(denom, 1.0)
    elif aggregation == "seq-mean":
        if seq_lengths is None:
            seq_lengths = torch.bincount(seq_index)
        weights = 1.0 / seq_lengths[seq_index].clamp(min=1).to(per_token.dtype)
        denom = seq_normaliser if seq_normaliser is not None else float(torch.unique(seq_index).numel())
        loss = (per_token * weights).sum() / max(denom, 1.0)
    else:
        raise ValueError(f"unknown loss aggregation {aggregation!r}: allowed token-mean, seq-mean")
    with torch.no_grad():
        is_clipped = (clipped > unclipped) & (advantages != 0)
        stats = LossStats(
            clip_fraction=float(is_clipped.float().mean()) if logp.numel() else 0.0,
            ratio_mean=float(ratio.mean()) if logp.numel() else 1.0,
            kl=float(kl.mean()) if logp.numel() else 0.0,
            pg_loss=float(pg.mean()) if logp.numel() else 0.0,
        )
    return loss, stats


def turn_returns(rewards: list[float], gamma: float) -> list[float]:
    """Discounted return-to-go of every turn: G_t = r_t + gamma * G_{t+1}."""
    out = [0.0] * len(rewards)
    acc = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        acc = rewards[t] + gamma * acc
        out[t] = acc
    return out


def state_group_advantages(groups: list[int], keys: list[list[object]], rewards: list[list[float]], gamma: float,
                           eps: float = 1e-6) -> list[list[float]]:
    """Turn-level advantages from anchor states (GiGPO, Feng et al. 2025): within one maze's group of
    episodes, the turns taken from the same state (same key) form a group of their own, and each
    turn's return-to-go is normalised against that group: (G - mean) / (std + eps). A state seen
    once, or whose turns all returned the same, gets 0. This credits the move made at a state,
    where the episode-level advantage credits every move of an episode alike.

    groups[i]: episode i's maze group; keys[i][t], rewards[i][t]: its turn t's state key and reward.
    """
    returns = [turn_returns(r, gamma) for r in rewards]
    buckets: dict[tuple[int, object], list[tuple[int, int]]] = {}
    for i, (g, ks) in enumerate(zip(groups, keys)):
        for t, k in enumerate(ks):
            buckets.setdefault((g, k), []).append((i, t))
    adv = [[0.0] * len(r) for r in rewards]
    for members in buckets.values():
        if len(members) < 2:
            continue
        vals = torch.tensor([returns[i][t] for i, t in members], dtype=torch.float64)
        std = vals.std(unbiased=False)
        if std < 1e-12:
            continue
        normed = (vals - vals.mean()) / (std + eps)
        for (i, t), a in zip(members, normed.tolist()):
            adv[i][t] = a
    return adv
