"""Pieces both learning jobs use: seeds and RNG state, and a quick greedy evaluation."""

from __future__ import annotations

import random
import time

import numpy as np
import torch

from ..envs.maze_env import EnvConfig
from ..mazes.dataset_io import read_split
from ..policy.config import PolicyConfig
from ..policy.trainable import TrainablePolicy
from ..rollout.multiturn import items_from_split, rollout
from .driver import episode_metrics


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


def greedy_success(tp: TrainablePolicy, cfg: PolicyConfig, split_path: str, n_mazes: int, env: EnvConfig) -> dict:
    """Quick greedy evaluation on the first `n_mazes` of a split (the full evaluation is `mazerl eval`)."""
    df = read_split(split_path)
    items = items_from_split(df, range(min(n_mazes, len(df))), cfg.render_scale)
    env = env.model_copy(update={"end_when_out_of_reach": False})  # play every turn, as `mazerl eval` does
    t0 = time.perf_counter()
    trajs = rollout(
        tp.engine, tp.chat, items, group_size=1,
        sampling=tp.sampling(temperature=0.0),
        env_config=env, history=cfg.history,
    )
    seconds = time.perf_counter() - t0
    played = episode_metrics(trajs)
    played.pop("reward_mean")  # the shaped reward: success is what evaluation reports
    return {"eval/success": played.pop("success_rate"), **{f"eval/{k}": v for k, v in played.items()},
            "eval/mazes": len(trajs), "eval/seconds": seconds}
