"""`mazerl train sft`: warm start by behaviour cloning on the BFS solver's moves.

The teacher plays each maze in the same multi-turn chat format the policy will use; with a small
probability a turn takes a random move instead, which the model is not trained to copy but whose
consequences it sees (so it learns to recover from mistakes, not only to follow perfect routes).
For the tiny model this stands in for the pretraining a real VLM already has.
"""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path

import psutil
import torch

from ..envs.agents import as_reply, oracle_action, random_action
from ..mazes.dataset_io import read_split
from ..mazes.seeding import derive_seed
from ..rollout.multiturn import items_from_split, rollout
from ..policy.trainable import save_model_dir
from ..rollout.factory import open_policy
from .common import greedy_success, refuse_inputs_in_run_files, seed_everything
from .config import SFTConfig
from .data import MazeSampler
from .logprobs import token_logprobs
from ..metrics import MetricsWriter
from .optim import check_loss, clip_and_check, make_optimizer


def teacher_batch(tp, cfg: SFTConfig, df, rows: list[int], step: int):
    """One learned turn from each maze's noisy-oracle episode."""
    items = items_from_split(df, rows, cfg.policy.render_scale)
    rng = random.Random(derive_seed(cfg.seed, "teacher", step))

    def teacher(env):
        if env.position != env.task.maze.goal and rng.random() < cfg.noise:
            return as_reply(random_action(env, rng)), False
        return as_reply(oracle_action(env)), True

    trajs = rollout(None, tp.chat, items, teacher=teacher, env_config=cfg.env, history=cfg.policy.history,
                    sampling=tp.sampling())
    batch = []
    for tr in trajs:
        learned = [s for s in tr.samples() if s.n_loss_tokens]
        if learned:
            batch.append(learned[rng.randrange(len(learned))])
    return batch


RUN_FILES = ("metrics.jsonl", "tensorboard", "final")  # what a warm start writes in output_dir


def train_sft(cfg: SFTConfig, on_step=None, overwrite: bool = False) -> dict:
    refuse_inputs_in_run_files(cfg, RUN_FILES)
    seed_everything(cfg.seed)
    out = Path(cfg.output_dir)
    earlier = [out / n for n in RUN_FILES if (out / n).exists()]
    if earlier and not overwrite:
        raise FileExistsError(f"{out} holds an earlier run ({', '.join(p.name for p in earlier)}); pass --overwrite to "
                              "replace it, or choose another output_dir")
    for p in earlier:
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    tp = open_policy(cfg.policy)
    model = tp.policy.model
    df = read_split(cfg.train_data)
    sampler = MazeSampler(len(df), cfg.seed)
    optimizer, scheduler = make_optimizer([p for p in model.parameters() if p.requires_grad], cfg.optim, cfg.steps)
    metrics = MetricsWriter(out / "metrics.jsonl", out / "tensorboard")
    proc = psutil.Process()
    started = time.perf_counter()
    record: dict = {}
    try:
        for step in range(1, cfg.steps + 1):
            t0 = time.perf_counter()
            batch = teacher_batch(tp, cfg, df, sampler.next(cfg.batch_size), step)
            t1 = time.perf_counter()
            tl = token_logprobs(model, tp.chat, batch, tp.sampling(temperature=1.0), allowed_ids=tp.reply_choices)
            loss = -tl.logprobs.mean()
            lr = scheduler.get_last_lr()[0]
            check_loss(loss, step, lr)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = clip_and_check(model.parameters(), cfg.optim.max_grad_norm, step, lr)
            optimizer.step()
            scheduler.step()
            # A reply is right when greedy decoding reproduces every one of its tokens.
            wrong = torch.zeros(len(batch), dtype=torch.long).index_add_(0, tl.sample_index.cpu(), (~tl.argmax_correct).long().cpu())
            record = {
                "step": step, "loss": loss.item(), "move_accuracy": float((wrong == 0).float().mean()),
                "token_accuracy": float(tl.argmax_correct.float().mean()), "grad_norm": float(grad_norm),
                "lr": scheduler.get_last_lr()[0], "time/teacher": t1 - t0, "time/update": time.perf_counter() - t1,
                "rss_mb": proc.memory_info().rss / 2**20,
            }
            if cfg.eval_every and cfg.eval_data and step % cfg.eval_every == 0:
                model.eval()
                record.update(greedy_success(tp, cfg.policy, cfg.eval_data, cfg.eval_mazes, cfg.env))
                model.train()
            metrics.write(record)
            if on_step:
                on_step(step, record)
            if cfg.max_minutes is not None and time.perf_counter() - started > cfg.max_minutes * 60:
                break
    finally:
        metrics.close()
    save_model_dir(model, tp.policy.processor, out / "final", cfg.policy)
    return record
