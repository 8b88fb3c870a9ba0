"""`mazerl train grpo`: the GRPO loop, readable top to bottom.

    for step in steps:
        mazes   = sampler.next(B)                          # resumable walk over the train split
        trajs   = rollout(engine, mazes, G samples each)   # multi-turn, sampled, exact token ids
        adv     = group-normalised episode rewards         # zero-variance groups dropped
        for mini-batch of mazes:                           # one optimizer step each
            for micro-batch of sequences:                  # gradient accumulation
                loss = clipped PG (+ k3 KL) over reply tokens; backward
            clip grads; AdamW step; LR schedule step
        log metrics; every N steps: greedy eval, checkpoint
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import time
from pathlib import Path

import psutil
import torch

from ..atomic import refuse_inputs_inside
from ..errors import UserError
from ..mazes.dataset_io import read_split
from ..mazes.seeding import derive_seed
from ..metrics import MetricsWriter
from ..policy.trainable import in_dtype, serving_weights
from ..rollout.factory import open_policy
from ..rollout.multiturn import Trajectory, items_from_split, rollout
from ..storage import CheckpointMirror
from ..integrity import verify
from .checkpoint import CheckpointManager, load_model_weights, load_trainer_state
from .common import greedy_success, refuse_inputs_in_run_files, rng_state, seed_everything, set_rng_state, training_inputs
from .config import GRPOConfig
from .data import train_sampler
from .driver import GRPODriver, StaleRolloutError, episode_metrics, turn_state_keys, update_stats  # noqa: F401 (re-exported)
from .optim import set_schedule_horizon
from .precision import mixed_precision, report_autocast
from .worker import PolicyWorker, compute_autocast

log = logging.getLogger(__name__)


class ResumeError(UserError):
    """A resume request that cannot be honoured without losing or inventing state."""


def check_resume_arg(how: str, checkpoints: Path | None = None) -> Path | None:
    """`auto` and `never` pass (None); anything else must be an existing checkpoint directory."""
    if how in ("auto", "never"):
        return None
    path = Path(how)
    if not path.is_dir():
        example = (checkpoints or Path("OUTPUT_DIR/checkpoints")) / "step-00000010"
        raise ResumeError(f"--resume {how!r}: not a checkpoint directory; allowed: auto (the latest complete checkpoint), "
                          f"never (start fresh), or a checkpoint directory such as {example}")
    return path


# Fault injection for the resume test: SIGKILL ourselves right after this step (never set in real runs).
KILL_AFTER_STEP_ENV = "MAZERL_FAULT_KILL_AFTER_STEP"


class GRPOTrainer(GRPODriver):
    def __init__(self, cfg: GRPOConfig, on_step=None):
        refuse_inputs_in_run_files(cfg, RUN_FILES)  # before any work: the run may replace these files
        if cfg.policy.engine == "vllm":  # its per-prompt limits, from the split it plays (cluster/plan.py)
            from ..cluster.plan import resolve_prompt_limits

            cfg = resolve_prompt_limits(cfg, read_split(cfg.train_data))
            if cfg.policy.device.startswith("cuda") and torch.cuda.is_available():  # its GPU share beside the trainer
                from ..cluster.plan import resolve_memory_share

                device = torch.device(cfg.policy.device)
                total = torch.cuda.get_device_properties(device.index or 0).total_memory
                cfg = resolve_memory_share(cfg, read_split(cfg.train_data), total)
        self.cfg = cfg
        self.on_step = on_step  # callback(step, metrics) for progress display
        self.out = Path(cfg.output_dir)
        seed_everything(cfg.seed)
        report_autocast(compute_autocast(cfg), cfg.policy.device, log)
        # float32 master weights (policy.dtype is what they compute in), the engine serving this very module
        self.tp = open_policy(cfg.policy, cfg.lora, for_training=True,
                              activation_checkpointing=cfg.distributed.activation_checkpointing)
        self.model = self.tp.policy.model
        if cfg.freeze_vision:
            frozen = [p for name, p in self.model.named_parameters() if ".visual." in f".{name}"]
            if not frozen:
                raise ValueError("freeze_vision: this model has no vision tower parameters (no '.visual.' in their names)")
            for p in frozen:
                p.requires_grad_(False)
        self.chat = self.tp.chat
        self.train_df = read_split(cfg.train_data)
        self.sampler = train_sampler(self.train_df, cfg.seed, cfg.curriculum_start, cfg.steps)
        self.worker = PolicyWorker(self.model, self.chat, self.tp.reply_choices, cfg,
                                   total_optimizer_steps=cfg.steps * cfg.optimizer_steps_per_step)
        self.optimizer, self.scheduler = self.worker.optimizer, self.worker.scheduler
        self.checkpoints = CheckpointManager(self.out / "checkpoints", cfg.keep_checkpoints)
        self.mirror = (CheckpointMirror(cfg.checkpoint_uri, cfg.keep_checkpoints, tensorboard=self.out / "tensorboard")
                       if cfg.checkpoint_uri else None)
        self.step = 0

    def set_schedule_horizon(self, steps: int) -> None:
        set_schedule_horizon(self.scheduler, steps * self.cfg.optimizer_steps_per_step)

    # ---- checkpoints -------------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        trainer_state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
        }
        state = {
            "step": self.step,
            "config": self.cfg.model_dump(mode="json"),
            "sampler": self.sampler.state_dict(),
            "rng": rng_state(),
            "rollout_seed": derive_seed(self.cfg.seed, "rollout", self.step + 1),
        }
        path = self.checkpoints.save(self.step, self.model, self.tp.policy.processor, trainer_state, state,
                                     view=self.cfg.policy.view())
        if self.mirror is not None:
            self.mirror.after_save(path)
        return path

    def resume(self, how: str, overwrite: bool = False, discard_damaged: bool = False) -> int | None:
        """Where the run starts (see `start_point`); the step resumed from, or None."""
        path = start_point(how, self.out, self.checkpoints, self.mirror, training_inputs(self.cfg), overwrite, discard_damaged)
        return None if path is None else self._load_checkpoint(path)

    def _load_checkpoint(self, path: Path) -> int:
        trainer_state, state = load_trainer_state(path)
        load_model_weights(self.model, path)
        self.optimizer.load_state_dict(trainer_state["optimizer"])
        self.scheduler.load_state_dict(trainer_state["scheduler"])
        torch.set_rng_state(trainer_state["torch_rng"])
        self.sampler.load_state_dict(state["sampler"])
        set_rng_state(state["rng"])
        self.step = int(state["step"])
        log.info("resumed from %s (step %d)", path, self.step)
        return self.step

    # ---- one step ------------------------------------------------------------------------------
    def collect(self) -> list[Trajectory]:
        cfg = self.cfg
        rows = self.sampler.next(cfg.mazes_per_step)
        items = items_from_split(self.train_df, rows, cfg.policy.render_scale, cfg.max_turns)
        sampling = self.tp.sampling(temperature=cfg.temperature, top_p=cfg.top_p,
                                       seed=derive_seed(cfg.seed, "rollout", self.step + 1))
        with mixed_precision(compute_autocast(cfg), cfg.policy.device):
            return rollout(self.tp.engine, self.chat, items, group_size=cfg.group_size, sampling=sampling,
                           env_config=cfg.env, history=cfg.policy.history)

    def update(self, trajs: list[Trajectory]) -> dict:
        """Driver (advantages, mini-batches) then one worker step per mini-batch."""
        cfg = self.cfg
        lag = self.check_versions(trajs)
        batches, stats = self.mini_batches(trajs)
        sampling = self.tp.sampling(temperature=cfg.temperature, top_p=cfg.top_p)  # what the rollouts sampled with
        if cfg.recompute_old_logprobs:
            self.worker.rescore_old_logprobs(batches, sampling)
        outputs = [self.worker.train_step(batch, sampling, self.step + 1) for batch in batches]
        stats.update(update_stats(outputs, self.scheduler.get_last_lr()[0]), weights_lag=lag)
        return stats

    def sync_weights(self) -> float:
        """After an update: the rollout engine serves the new weights, tagged with the new version."""
        t0 = time.perf_counter()
        self._sync_engine()
        return time.perf_counter() - t0

    def _sync_engine(self) -> None:
        # the in-process HF engine serves this very module, so there is nothing to copy; an engine with
        # its own copy (vLLM) gets the weights in plain keys, LoRA adapters merged
        engine = self.tp.engine
        weights = None
        if not engine.shares_module:
            weights = serving_weights(self.tp.policy.model.state_dict(), self.cfg.lora)
            weights = in_dtype(weights, self.cfg.policy.dtype)  # its own dtype, not the float32 masters
        engine.sync_weights(weights, version=self.step)

    # ---- the loop ------------------------------------------------------------------------------
    def run(self, resume: str = "auto", overwrite: bool = False, discard_damaged: bool = False) -> dict:
        cfg = self.cfg
        resumed = self.resume(resume, overwrite, discard_damaged)
        self._sync_engine()  # version = updates applied so far (the resumed weights, on resume)
        metrics = MetricsWriter(self.out / "metrics.jsonl", self.out / "tensorboard", resume_step=resumed)
        kill_after = int(os.environ.get(KILL_AFTER_STEP_ENV, "0") or 0)
        proc = psutil.Process()
        record: dict = {}
        eval_seconds = 0.0  # periodic evaluation does not count against max_minutes
        evals_by_time = 0
        try:
            if resumed is None and (cfg.eval_every or cfg.eval_every_minutes) and cfg.eval_data:
                metrics.write({"step": 0, **greedy_success(self.tp, cfg.policy, cfg.eval_data, cfg.eval_mazes, cfg.env)})
            started, first_step = time.perf_counter(), self.step
            while self.step < cfg.steps:
                t0 = time.perf_counter()
                trajs = self.collect()
                t1 = time.perf_counter()
                upd = self.update(trajs)
                self.step += 1
                upd["time/weight_sync"] = self.sync_weights()
                t2 = time.perf_counter()
                context_tokens = sum(len(s.ids) for t in trajs for s in t.samples())
                record = {"step": self.step, **episode_metrics(trajs), **upd,
                          "train_pool_mazes": self.sampler.available(self.step),
                          "time/rollout": t1 - t0, "time/update": t2 - t1,
                          "rollout_tokens_per_s": context_tokens / max(t1 - t0, 1e-9),
                          "train_tokens_per_s": upd["train_tokens"] / max(t2 - t1, 1e-9)}
                trained_s = time.perf_counter() - started - eval_seconds
                due_by_time = cfg.eval_every_minutes is not None and trained_s >= (evals_by_time + 1) * cfg.eval_every_minutes * 60
                if cfg.eval_data and ((cfg.eval_every and self.step % cfg.eval_every == 0) or due_by_time):
                    record.update(greedy_success(self.tp, cfg.policy, cfg.eval_data, cfg.eval_mazes, cfg.env))
                    record["eval/training_minutes"] = trained_s / 60
                    eval_seconds += record["eval/seconds"]
                    evals_by_time += int(due_by_time)
                record["time/training_total"] = time.perf_counter() - started - eval_seconds
                out_of_time = cfg.max_minutes is not None and record["time/training_total"] > cfg.max_minutes * 60
                self.fit_schedule(record, first_step)  # before the checkpoint, which keeps the horizon
                if self.step % cfg.checkpoint_every == 0 or self.step == cfg.steps or out_of_time:
                    tc = time.perf_counter()
                    self.save_checkpoint()
                    record["time/checkpoint"] = time.perf_counter() - tc
                record["time/step"] = time.perf_counter() - t0
                record["rss_mb"] = proc.memory_info().rss / 2**20
                metrics.write(record)
                if self.on_step:
                    self.on_step(self.step, record)
                if kill_after and self.step == kill_after:
                    os.kill(os.getpid(), signal.SIGKILL)
                if out_of_time:
                    break
        finally:
            metrics.close()
        # in policy.dtype, LoRA merged, tensor by tensor: no merged copy of the model beside the trained one
        from ..policy.export import save_trained_model

        save_trained_model(self.model, self.tp.policy.processor, self.out / "final", cfg.policy, cfg.lora)
        return record


RUN_FILES = ("checkpoints", "metrics.jsonl", "tensorboard", "final")  # what a run writes in output_dir


def run_files(out: Path) -> list[Path]:
    """An earlier run's files in `out` (empty folders do not count)."""
    return [out / n for n in RUN_FILES if (out / n).exists() and not ((out / n).is_dir() and not any((out / n).iterdir()))]


def start_point(how: str, out: Path, checkpoints, mirror, inputs: dict, overwrite: bool = False,
                discard_damaged: bool = False) -> Path | None:
    """The checkpoint a run resumes from, or None for a fresh start (both backends use it).

    `auto`: the latest complete checkpoint (fetched from the mirror on S3 when none is local);
    `never`: a fresh start; else a checkpoint directory, its manifest hashes verified. A fresh start
    goes only into an output directory without an earlier run's files, unless `overwrite` (which
    removes them, never an input). Checkpoints that exist but all fail verification are an error
    naming each, not a restart from step 0, `overwrite` or not: discarding them takes
    `discard_damaged` (--discard-damaged-checkpoints). Every checkpoint a fresh start removes is named
    in a warning."""
    # what the run reads is never pruned, nor a checkpoint it was told to resume from
    checkpoints.inputs = tuple(Path(p) for p in inputs.values() if p is not None)
    if how not in ("auto", "never"):
        path = check_resume_arg(how, checkpoints.root)
        problem = verify(path)
        if problem is not None:
            raise ResumeError(f"--resume {path}: this checkpoint cannot be trusted: {problem}")
        checkpoints.inputs += (path,)
        return path
    if how == "auto":
        path = checkpoints.latest()  # each checkpoint verified once: the ranks do not verify it again
        if path is None and mirror is not None:
            # e.g. a new pod: the run's checkpoints are on S3; the download checks every file's hash
            path = mirror.restore_latest(checkpoints.root)
        found = checkpoints.step_dirs()
        if path is not None:
            return path
        if found and not discard_damaged:
            problems = "; ".join(f"{p.name}: {verify(p)}" for _, p in found)
            raise ResumeError(f"no usable checkpoint in {checkpoints.root}: every one is damaged ({problems}); nothing "
                              "was discarded. Resume from a repaired checkpoint with --resume DIR, or discard them and "
                              "start over from step 0 with --discard-damaged-checkpoints --overwrite")
    earlier = run_files(out)
    if earlier and not overwrite:
        raise ResumeError(f"{out} holds an earlier run ({', '.join(p.name for p in earlier)}) and nothing to "
                          "resume from; pass --overwrite to replace it, or choose another output_dir")
    refuse_inputs_inside(out, inputs, replaced=earlier, choose="choose another output_dir")
    discarded = [p for _, p in checkpoints.step_dirs()] if checkpoints.root in earlier else []
    if discarded:  # never silently: each checkpoint thrown away is named, with what was wrong with it
        log.warning("starting over from step 0: discarding %d checkpoint(s) in %s: %s", len(discarded), checkpoints.root,
                    "; ".join(p.name + (f" (damaged: {problem})" if (problem := verify(p)) else " (intact)") for p in discarded))
    for p in earlier:
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    return None
