"""The part of a GRPO update that touches the weights: forward, backward, optimizer step.

`PolicyWorker.train_step` runs one optimizer step on a mini-batch prepared by the driver
(`GRPOTrainer.mini_batches`). In one process it sees the whole mini-batch; as one of N ranks of a
data-parallel group (FSDP2, `distributed/`) it trains on every N-th sample (the Ray driver sends each
rank only those: `MiniBatch.slice_for_rank`), keeps the mini-batch's global normalisers, and scales its loss by N because FSDP averages gradients across ranks: the
summed gradient, and so the update, is the same as in one process.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from ..policy.chat import ChatFormat, PackedSample
from ..policy.sampling import SamplingParams
from .config import GRPOConfig
from .grpo import grpo_loss
from .logprobs import token_logprobs
from .optim import check_loss, clip_and_check, make_optimizer
from .precision import mixed_precision


@dataclass
class MiniBatch:
    """What one optimizer step trains on: packed samples with their per-token advantages, and the
    normalisers of the whole mini-batch (so gradient accumulation and sharding do not change the loss)."""

    samples: list[PackedSample]
    episode: list[int]  # per sample: its trajectory index (sequence id for seq-mean aggregation)
    token_advantages: list[torch.Tensor]  # per sample: one advantage per loss token
    tokens: int  # loss tokens in the mini-batch
    episodes: int  # trajectories in the mini-batch
    episode_tokens: torch.Tensor  # per trajectory index: its loss tokens in the mini-batch
    # On a rank's slice (`slice_for_rank`): the (rank, world size) it was cut for, how many of its samples
    # are its own, and the most samples any rank owns (every rank runs that many micro-batches' worth).
    cut_for: tuple[int, int] | None = None
    own_samples: int = 0
    most_rank_samples: int = 0

    def slice_for_rank(self, rank: int, world_size: int) -> "MiniBatch":
        """What rank `rank` of `world_size` trains on, and all it needs to be sent: every
        `world_size`-th sample from `rank` on, with the whole mini-batch's normalisers. A rank with no
        sample of its own gets the first one as a stand-in for its zero-weight pass (FSDP's collectives
        need every rank to run)."""
        own = list(range(rank, len(self.samples), world_size))
        sent = own if own or not self.samples else [0]
        return MiniBatch(samples=[self.samples[i] for i in sent], episode=[self.episode[i] for i in sent],
                         token_advantages=[self.token_advantages[i] for i in sent], tokens=self.tokens,
                         episodes=self.episodes, episode_tokens=self.episode_tokens, cut_for=(rank, world_size),
                         own_samples=len(own), most_rank_samples=-(-len(self.samples) // world_size))


def compute_autocast(cfg: GRPOConfig) -> str:
    """What a GRPO update (and the in-process rollouts) compute in, for `mixed_precision`: policy.dtype when it
    is below float32 (the trained weights are then float32 masters, `open_policy(for_training=True)`, and
    only the arithmetic is in policy.dtype), else the `autocast` setting over float32 weights."""
    return cfg.policy.dtype if cfg.policy.dtype != "float32" else cfg.autocast


class PolicyWorker:
    def __init__(self, model, chat: ChatFormat, reply_choices: tuple[int, ...] | None, cfg: GRPOConfig,
                 total_optimizer_steps: int, rank: int = 0, world_size: int = 1, reference=None):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        self.model, self.chat, self.choices, self.cfg = model, chat, reply_choices, cfg
        self.rank, self.world_size = rank, world_size
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer, self.scheduler = make_optimizer(params, cfg.optim, total_optimizer_steps)
        # The KL anchor: the initial weights (a LoRA model uses itself, adapters off). A sharded policy
        # passes a reference sharded the same way; in one process a copy will do.
        self.reference = reference
        if reference is None and cfg.kl_coef > 0 and cfg.lora is None:
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)
            if cfg.policy.dtype != "float32":  # never trained: it may hold the compute dtype, at half the memory
                self.reference.to(getattr(torch, cfg.policy.dtype))

    def _reference_logprobs(self, samples, sampling) -> torch.Tensor:
        with torch.no_grad():
            if self.reference is not None:
                return token_logprobs(self.reference, self.chat, samples, sampling, False, self.choices).logprobs
            with self.model.disable_adapter():
                return token_logprobs(self.model, self.chat, samples, sampling, False, self.choices).logprobs

    def _micro_batch_rows(self, batch: MiniBatch) -> list[list[int]]:
        """This rank's sample indices, one list per micro-batch: every N-th sample of a whole mini-batch,
        or every own sample of the rank's slice. Every rank runs the same number of micro-batches
        (FSDP's collectives pair them up); a rank short of samples gets an empty list, for a zero-weight pass."""
        if batch.cut_for is None:
            mine = list(range(self.rank, len(batch.samples), self.world_size))
            per_rank = -(-len(batch.samples) // self.world_size)
        elif batch.cut_for != (self.rank, self.world_size):
            raise ValueError(f"a mini-batch slice cut for rank {batch.cut_for[0]} of {batch.cut_for[1]} was sent to "
                             f"rank {self.rank} of {self.world_size}")
        else:
            mine, per_rank = list(range(batch.own_samples)), batch.most_rank_samples
        return [mine[start : start + self.cfg.micro_batch] for start in range(0, per_rank, self.cfg.micro_batch)]

    def rescore_old_logprobs(self, batches: list[MiniBatch], sampling: SamplingParams) -> None:
        """`recompute_old_logprobs`: before the step's first update, score this worker's sampled tokens
        with the trainer's weights (an engine's numbers differ slightly) and keep them as the behaviour
        policy's. Done for every mini-batch up front, so later mini-batches are still compared with
        the weights that sampled them, not with weights this step already changed."""
        with torch.no_grad(), mixed_precision(compute_autocast(self.cfg), self.cfg.policy.device):
            for batch in batches:
                if not batch.samples:
                    continue
                for rows in self._micro_batch_rows(batch):
                    samples = [batch.samples[i] for i in rows or [0]]
                    tl = token_logprobs(self.model, self.chat, samples, sampling, False, self.choices)
                    for k, i in enumerate(rows):
                        smp = batch.samples[i]
                        scored = iter(tl.logprobs[tl.sample_index == k].tolist())
                        smp.old_logprobs = [next(scored) if m else 0.0 for m in smp.loss_mask]

    def train_step(self, batch: MiniBatch, sampling: SamplingParams, step: int) -> dict:
        """One optimizer step on this worker's share of `batch` (gradient accumulation over
        micro-batches). An empty mini-batch still advances the learning-rate schedule, so the
        schedule never depends on how many groups were filtered. Sums are over this worker's tokens."""
        cfg = self.cfg
        sums = {"loss": 0.0, "entropy": 0.0, "kl": 0.0, "clip_fraction": 0.0, "pg_loss": 0.0, "tokens": 0, "train_tokens": 0}
        if not batch.samples:
            self.scheduler.step()
            return {**sums, "grad_norm": None}
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.zero_grad(set_to_none=True)
        for rows in self._micro_batch_rows(batch):
            weight = 1.0 if rows else 0.0
            rows = rows or [0]
            samples = [batch.samples[i] for i in rows]
            traj_of_row = torch.tensor([batch.episode[i] for i in rows])
            with mixed_precision(compute_autocast(cfg), cfg.policy.device):  # backward follows the forward's dtypes
                ref = self._reference_logprobs(samples, sampling) if cfg.kl_coef > 0 else None
                tl = token_logprobs(self.model, self.chat, samples, sampling, allowed_ids=self.choices)
            old = tl.old_logprobs  # the engine's, or the trainer's own after rescore_old_logprobs
            seq = traj_of_row[tl.sample_index.cpu()]
            token_adv = torch.cat([batch.token_advantages[i] for i in rows])
            loss, ls = grpo_loss(
                tl.logprobs, old, token_adv.to(tl.logprobs.device), seq,
                clip_low=cfg.clip_low, clip_high=cfg.clip_high, ref_logp=ref, kl_coef=cfg.kl_coef,
                aggregation=cfg.loss_aggregation, token_normaliser=float(batch.tokens),
                seq_normaliser=float(batch.episodes), seq_lengths=batch.episode_tokens,
            )
            loss = loss * weight
            check_loss(loss, step, lr)
            (loss * self.world_size).backward()  # FSDP averages gradients over ranks; we want their sum
            if weight:
                k = tl.logprobs.numel()
                sums["loss"] += float(loss.detach())
                sums["entropy"] += float(tl.entropy.sum())
                sums["kl"] += ls.kl * k
                sums["clip_fraction"] += ls.clip_fraction * k
                sums["pg_loss"] += ls.pg_loss * k
                sums["tokens"] += k
                sums["train_tokens"] += sum(len(smp.ids) for smp in samples)
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = clip_and_check(params, cfg.optim.max_grad_norm, step, lr)
        self.optimizer.step()
        self.scheduler.step()
        return {**sums, "grad_norm": grad_norm}
