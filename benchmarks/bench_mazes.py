"""Maze generation and environment throughput, side by side in one run.

1. Generate + solve 8x8-cell Wilson mazes: mazerl vs the `maze-dataset` package (same size, same
   algorithm, a shortest path solved for each maze).
2. Rendered environment steps: mazerl's batched env (frames repainted incrementally) vs the same
   env played one maze at a time with every frame re-rendered from scratch (the way VisGym's env
   renders), and VisGym's own figure on these machines (~5,000 steps/s, ~900 resets/s), which
   cannot be run here (not on PyPI).

Usage: python benchmarks/bench_mazes.py [--seconds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import time
import warnings

import numpy as np

from mazerl.envs.maze_env import EnvConfig, MazeEnv, MazeEnvBatch, MazeTask
from mazerl.mazes.render import render_rgb
from mazerl.mazes.sampling import sample_maze
from mazerl.mazes.solver import solve

VISGYM_STEPS_PER_S = 5000  # measured for maze_2d/easy on these machines (issue #2)
VISGYM_RESETS_PER_S = 900


def timed(fn, seconds: float) -> tuple[int, float]:
    """Call fn() (which returns a count of work items) until `seconds` pass; return (items, elapsed)."""
    items = 0
    t0 = time.perf_counter()
    while True:
        items += fn()
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return items, elapsed


def bench_generation(seconds: float) -> dict:
    counter = iter(range(10**9))

    def ours() -> int:
        m = sample_maze("wilson", (8, 8), next(counter))
        solve(m.grid, m.start, m.goal)
        return 1

    from maze_dataset import LatticeMazeGenerators

    def theirs() -> int:
        m = LatticeMazeGenerators.gen_wilson((8, 8))
        m.find_shortest_path((0, 0), (7, 7))
        return 1

    n_ours, t_ours = timed(ours, seconds)
    n_theirs, t_theirs = timed(theirs, seconds)
    return {
        "mazerl_mazes_per_s": n_ours / t_ours,
        "maze_dataset_mazes_per_s": n_theirs / t_theirs,
        "ratio": (n_ours / t_ours) / (n_theirs / t_theirs),
    }


def bench_env(seconds: float, batch: int = 256) -> dict:
    tasks = [MazeTask.build(sample_maze("wilson", (4, 4), s)) for s in range(batch)]
    config = EnvConfig(max_turns=10_000)  # no time-outs within a measurement: steps, not resets
    rng = random.Random(0)
    replies = ["<action>right</action>", "<action>up</action>", "<action>left</action>", "<action>down</action>"]

    envs = MazeEnvBatch(tasks, config)
    envs.reset()

    def batched_steps() -> int:
        if envs.envs[0].done:  # all share the turn budget, so all are done together
            envs.reset()
        envs.step([replies[rng.randrange(4)] for _ in range(batch)])
        return batch

    def batched_resets() -> int:
        envs.reset()
        return batch

    single = MazeEnv(tasks[0], config)
    single.reset()

    def naive_steps() -> int:
        if single.done:
            single.reset()
        out = single.step(replies[rng.randrange(4)])
        render_rgb(tasks[0].maze.grid, out.observation.position, tasks[0].maze.goal)  # full re-render
        return 1

    def naive_resets() -> int:
        m = sample_maze("wilson", (4, 4), rng.randrange(10**9))
        MazeEnv(m, config).reset()
        return 1

    n_b, t_b = timed(batched_steps, seconds)
    n_br, t_br = timed(batched_resets, seconds / 2)
    n_n, t_n = timed(naive_steps, seconds)
    n_nr, t_nr = timed(naive_resets, seconds / 2)
    # Frames must be right, not just fast: the incrementally painted frame equals a full render.
    for env in envs.envs[:16]:
        full = render_rgb(env.task.maze.grid, env.position, env.task.maze.goal)
        assert np.array_equal(env.render(), full)
    steps = n_b / t_b
    return {
        "batch": batch,
        "batched_steps_per_s": steps,
        "batched_resets_per_s": n_br / t_br,
        "one_at_a_time_full_render_steps_per_s": n_n / t_n,
        "one_at_a_time_new_maze_resets_per_s": n_nr / t_nr,
        "ratio_vs_one_at_a_time": steps / (n_n / t_n),
        "ratio_vs_visgym_reported": steps / VISGYM_STEPS_PER_S,
        "visgym_reported_steps_per_s": VISGYM_STEPS_PER_S,
        "visgym_reported_resets_per_s": VISGYM_RESETS_PER_S,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0, help="time per measurement")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    results = {"generation_8x8_wilson": bench_generation(args.seconds), "env_steps_rendered": bench_env(args.seconds)}
    print(json.dumps(results, indent=2))
    if args.json:
        from mazerl.atomic import write_json

        write_json(args.json, results)


if __name__ == "__main__":
    main()
