"""Pieces both learning jobs use: opening the policy for training, RNG state, greedy evaluation."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..envs.maze_env import EnvConfig
from ..mazes.dataset_io import read_split
from ..policy.chat import ChatFormat
from ..policy.grammar import ActionGrammar
from ..policy.loading import Policy, load_policy
from ..policy.prompts import PROMPTS
from ..rollout.engine import HFEngine
from ..rollout.multiturn import items_from_split, rollout
from .config import LoraSettings, PolicyConfig


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def rng_state() -> dict:
    """Python and numpy RNG states as JSON-able data (torch's goes in trainer_state.pt)."""
    py = random.getstate()
    np_state = np.random.get_state()
    return {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
    }


def set_rng_state(state: dict) -> None:
    v, internal, gauss = state["python"]
    random.setstate((v, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


@dataclass
class TrainablePolicy:
    policy: Policy
    chat: ChatFormat
    engine: HFEngine
    reply_choices: tuple[int, ...] | None = None  # the action grammar's word ids (None: free replies)


def open_policy(cfg: PolicyConfig, lora: LoraSettings | None = None) -> TrainablePolicy:
    policy = load_policy(cfg.model, dtype=cfg.dtype, device=cfg.device)
    if lora is not None:
        from peft import LoraConfig, get_peft_model

        policy.model = get_peft_model(
            policy.model,
            LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=lora.target_modules),
        )
    policy.model.train()
    chat = ChatFormat(policy.processor, system_prompt=PROMPTS[cfg.prompt])
    choices = ActionGrammar.from_chat(chat).word_ids if cfg.reply_grammar == "action" else None
    return TrainablePolicy(policy, chat, HFEngine.from_chat(policy.model, chat, max_batch=cfg.max_batch), choices)


def save_model_dir(model, processor, target, view: PolicyConfig | None = None) -> None:
    """HF layout that `from_pretrained` opens; a LoRA model is saved merged. `view` (how the policy
    sees mazes) is saved beside it as mazerl_policy.json."""
    from ..atomic import atomic_directory, write_json

    with atomic_directory(target, overwrite=True) as tmp:
        to_save = model
        if hasattr(model, "merge_and_unload"):
            import copy

            to_save = copy.deepcopy(model).merge_and_unload()
        to_save.save_pretrained(tmp, safe_serialization=True)
        processor.save_pretrained(tmp)
        if view is not None:
            write_json(tmp / PolicyConfig.VIEW_FILE, view.view())


def greedy_success(tp: TrainablePolicy, cfg: PolicyConfig, split_path: str, n_mazes: int, env: EnvConfig) -> dict:
    """Quick greedy evaluation on the first `n_mazes` of a split (the full evaluation is `mazerl eval`)."""
    df = read_split(split_path)
    items = items_from_split(df, range(min(n_mazes, len(df))), cfg.render_scale)
    t0 = time.perf_counter()
    trajs = rollout(
        tp.engine, tp.chat, items, group_size=1,
        sampling=cfg.sampling(temperature=0.0),
        env_config=env, history=cfg.history,
    )
    n = len(trajs)
    return {
        "eval/success": sum(t.stats.success for t in trajs) / n,
        "eval/turns": sum(t.stats.turns for t in trajs) / n,
        "eval/loop_rate": sum(t.stats.loop for t in trajs) / n,
        "eval/parse_failure_rate": sum(t.stats.parse_failures for t in trajs) / max(1, sum(t.stats.turns for t in trajs)),
        "eval/mazes": n,
        "eval/seconds": time.perf_counter() - t0,
    }
