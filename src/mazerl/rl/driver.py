"""The driver's side of a GRPO update, shared by the in-process trainer and the Ray backend: which
turns to train on, their advantages (episode- and turn-level), the weights-version check, and the
mini-batches each worker step receives."""

from __future__ import annotations

import math
import random

import torch

from ..errors import UserError
from ..mazes.layout import MOVE_NAMES
from ..mazes.seeding import derive_seed
from ..rollout.multiturn import Trajectory
from .config import GRPOConfig
from .grpo import group_advantages, state_group_advantages
from .worker import MiniBatch


class StaleRolloutError(UserError):
    """Trajectories sampled with weights older than the trainer allows."""


def episode_metrics(trajs: list[Trajectory]) -> dict:
    n = len(trajs)
    turns = sum(t.stats.turns for t in trajs)
    return {
        "reward_mean": sum(t.reward for t in trajs) / n,
        "success_rate": sum(t.stats.success for t in trajs) / n,
        "episode_turns": turns / n,
        "parse_failure_rate": sum(t.stats.parse_failures for t in trajs) / max(1, turns),
        "wall_bump_rate": sum(t.stats.wall_bumps for t in trajs) / max(1, turns),
        "loop_rate": sum(t.stats.loop for t in trajs) / n,
        "premature_stop_rate": sum(t.stats.premature_stop for t in trajs) / n,
        "truncated_reply_rate": sum(t.truncated_replies for t in trajs) / max(1, turns),
    }


def turn_state_keys(traj: Trajectory) -> list[tuple]:
    """Per turn, what the policy saw, up to the turn counter: the square it stood on, its previous
    move and whether that move hit a wall (the feedback). Turns with equal keys are one anchor state."""
    path, actions = traj.stats.path, traj.stats.actions
    keys = []
    for t in range(len(traj.rewards)):
        prev = actions[t - 1] if t > 0 else None
        bumped = t > 0 and prev in MOVE_NAMES and path[t] == path[t - 1]
        keys.append((tuple(path[t]), prev, bumped))
    return keys


def update_stats(step_outputs: list[dict], lr: float) -> dict:
    """One update's metrics from its worker-step outputs (`PolicyWorker.train_step`, every mini-batch
    and, on Ray, every rank): token-weighted means, and the mean gradient norm over optimizer steps
    (the norm is the whole mini-batch's, so one rank's value per mini-batch is passed)."""
    totals = {k: sum(o[k] for o in step_outputs) for k in ("entropy", "kl", "clip_fraction", "pg_loss", "tokens", "train_tokens")}
    norms = [o["grad_norm"] for o in step_outputs if o.get("grad_norm") is not None]
    t = max(1, totals["tokens"])
    return {"entropy": totals["entropy"] / t, "kl": totals["kl"] / t, "clip_fraction": totals["clip_fraction"] / t,
            "pg_loss": totals["pg_loss"] / t, "grad_norm": sum(norms) / max(1, len(norms)), "optimizer_steps": len(norms),
            "loss_tokens": totals["tokens"], "train_tokens": totals["train_tokens"], "lr": lr}


def steps_that_fit(step: int, steps: int, trained_seconds: float, steps_this_run: int, max_minutes: float) -> int:
    """The GRPO step the run will stop at: `steps`, or sooner when max_minutes runs out first. The run stops
    after the first step that ends past the deadline, so at this run's mean step time that is
    ceil(remaining / mean) steps from now (at least one more: the caller has not stopped yet)."""
    mean = trained_seconds / max(1, steps_this_run)
    remaining = max_minutes * 60 - trained_seconds
    if mean <= 0:
        return steps
    return min(steps, max(step + 1, step + math.ceil(remaining / mean)))


class GRPODriver:
    """Needs `cfg` (GRPOConfig), `step` (updates applied so far), `sampler` (rl.data) and `set_schedule_horizon`."""

    cfg: GRPOConfig
    step: int

    def set_schedule_horizon(self, steps: int) -> None:
        """End the learning-rate schedule at GRPO step `steps` (each backend moves its optimizers')."""
        raise NotImplementedError

    def fit_schedule(self, record: dict, first_step: int) -> None:
        """With fit_schedule_to_max_minutes: end the schedule (the learning rate's, and a curriculum's growth to
        the whole pool) at the step the deadline allows, given this run's training time so far
        (record["time/training_total"]) over the steps since `first_step`."""
        cfg = self.cfg
        if (not cfg.fit_schedule_to_max_minutes or cfg.max_minutes is None
                or record["time/training_total"] > cfg.max_minutes * 60):
            return  # not asked for, no deadline, or the run stops on this step
        end = steps_that_fit(self.step, cfg.steps, record["time/training_total"], self.step - first_step, cfg.max_minutes)
        self.set_schedule_horizon(end)
        self.sampler.set_horizon(end)
        record["lr_schedule_steps"] = end

    def _update_samples(self, traj: Trajectory, index: int, advantages: list[float]):
        """The episode's training sequences with loss tokens (with `skip_zero_advantage_turns`, only
        those of turns whose advantage is not 0: without a KL term they add nothing to the gradient);
        a seeded random subset of at most `update_turns_per_episode` of them when that is set."""
        samples = [s for s in traj.samples() if s.n_loss_tokens]
        if self.cfg.skip_zero_advantage_turns:
            samples = [s for s in samples if any(advantages[t - 1] != 0.0 for t, m in zip(s.token_turns, s.loss_mask) if m)]
        k = self.cfg.update_turns_per_episode
        if k is None or len(samples) <= k:
            return samples
        rng = random.Random(derive_seed(self.cfg.seed, "update-turns", self.step, index))
        return [samples[j] for j in sorted(rng.sample(range(len(samples)), k))]

    def turn_advantages(self, trajs: list[Trajectory], episode_adv: torch.Tensor) -> list[list[float]]:
        """Per episode, per turn: the episode's advantage plus, when turn_advantage_weight > 0, the
        weighted advantage of the move among the group's moves from the same state (or, with
        turn_baseline 'group', among all the group's moves)."""
        cfg = self.cfg
        out = [[cfg.episode_advantage_weight * float(episode_adv[i])] * len(t.rewards) for i, t in enumerate(trajs)]
        if cfg.turn_advantage_weight > 0:
            # one anchor for every turn of a group when the baseline is the whole group
            keys = ([turn_state_keys(t) for t in trajs] if cfg.turn_baseline == "state"
                    else [[None] * len(t.rewards) for t in trajs])
            step = state_group_advantages([t.group for t in trajs], keys,
                                          [list(t.rewards) for t in trajs], cfg.turn_gamma)
            out = [[a + cfg.turn_advantage_weight * s for a, s in zip(row, srow)] for row, srow in zip(out, step)]
        if cfg.positive_advantages_only:
            out = [[max(a, 0.0) for a in row] for row in out]
        return out

    # ---- the driver's part of an update: advantages, filtering, mini-batches ----------------------
    def check_versions(self, trajs: list[Trajectory]) -> int:
        """Every trajectory must come from the current weights, or lag them by at most
        `max_weights_lag` updates (asynchronous rollouts); returns the largest lag seen."""
        lag = max((self.step - t.weights_version for t in trajs), default=0)
        if lag > self.cfg.max_weights_lag or any(t.weights_version > self.step for t in trajs):
            versions = sorted({t.weights_version for t in trajs})
            raise StaleRolloutError(f"step {self.step + 1}: trajectories were sampled with weights version(s) {versions}, "
                                    f"the trainer is at version {self.step}; allowed lag: max_weights_lag = "
                                    f"{self.cfg.max_weights_lag}")
        return lag

    def mini_batches(self, trajs: list[Trajectory]) -> tuple[list[MiniBatch], dict]:
        """Group-normalised advantages per turn, zero-signal episodes dropped, then one MiniBatch per
        optimizer step (`mini_batch_mazes` mazes each, all when unset)."""
        cfg = self.cfg
        rewards = torch.tensor([t.reward for t in trajs])
        groups = torch.tensor([t.group for t in trajs])
        adv, zero_var = group_advantages(rewards, groups, cfg.scale_advantages_by_std)
        per_turn = self.turn_advantages(trajs, adv)
        # an episode carries no signal when every one of its turns has advantage 0
        per_turn_signal = cfg.turn_advantage_weight > 0 or cfg.positive_advantages_only or cfg.episode_advantage_weight != 1.0
        no_signal = [all(a == 0.0 for a in row) for row in per_turn] if per_turn_signal else zero_var.tolist()
        keep = [i for i in range(len(trajs)) if not (cfg.filter_zero_variance_groups and no_signal[i])]
        dropped = torch.tensor([no_signal[i] for i in range(len(trajs))], dtype=torch.bool)
        stats = {"filtered_groups": int(len(torch.unique(groups[zero_var & dropped]))) if cfg.filter_zero_variance_groups else 0,
                 "kept_episodes": len(keep)}
        mini = cfg.mini_batch_mazes or cfg.mazes_per_step
        batches = []
        for first_group in range(0, cfg.mazes_per_step, mini):
            members = [i for i in keep if first_group <= trajs[i].group < first_group + mini]
            pairs = [(s, i) for i in members for s in self._update_samples(trajs[i], i, per_turn[i])]
            seq_len = torch.zeros(len(trajs), dtype=torch.long)
            for smp, i in pairs:
                seq_len[i] += smp.n_loss_tokens
            # loss tokens come row by row, left to right: the order token_logprobs returns them in
            token_adv = [torch.tensor([per_turn[i][smp.token_turns[c] - 1] for c, m in enumerate(smp.loss_mask) if m],
                                      dtype=torch.float32) for smp, i in pairs]
            batches.append(MiniBatch(samples=[smp for smp, _ in pairs], episode=[i for _, i in pairs], token_advantages=token_adv,
                                     tokens=sum(smp.n_loss_tokens for smp, _ in pairs), episodes=len(members), episode_tokens=seq_len))
        stats["trained_turns"] = sum(len(b.samples) for b in batches)
        return batches, stats
