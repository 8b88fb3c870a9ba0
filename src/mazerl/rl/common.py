"""Pieces both learning jobs use: seeds and RNG state, and a quick greedy evaluation."""

from __future__ import annotations

import random
import time
from pathlib import Path

import numpy as np
import torch

from ..atomic import existing_path, refuse_inputs_inside
from ..envs.maze_env import EnvConfig
from ..mazes.dataset_io import read_split
from ..policy.config import PolicyConfig
from ..rollout.factory import TrainablePolicy
from ..rollout.multiturn import items_from_split, rollout
from .driver import episode_metrics


def training_inputs(cfg) -> dict[str, str | Path | None]:
    """What a training run reads, by setting name: its base model (when a local path), its data."""
    return {"policy.model": existing_path(cfg.policy.model), "train_data": cfg.train_data, "eval_data": cfg.eval_data}


def refuse_inputs_in_run_files(cfg, run_files: tuple[str, ...], extra: dict | None = None) -> None:
    """A run replaces its own files in output_dir (`run_files`: `final/` at its end, and everything
    with --overwrite); none of its inputs (`extra`: the config file) may lie among them. Checked
    before any work starts."""
    out = Path(cfg.output_dir)
    refuse_inputs_inside(out, {**training_inputs(cfg), **(extra or {})}, replaced=[out / name for name in run_files],
                         choose="choose another output_dir")


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
