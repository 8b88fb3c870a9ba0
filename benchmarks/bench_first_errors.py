"""Where a policy's greedy play goes wrong on held-out mazes: the first move of each failed episode that
leaves every shortest route, what kind of square it was made on, and how much probability the policy
gave the right move there (at temperature 1: what GRPO's sampling can find).

With 18 turns for 16-move routes a single wrong turn loses the episode, so the first error decides it;
what the policy does afterwards (loops, bumps) does not change the outcome.

Usage: python benchmarks/bench_first_errors.py [--model tiny-base] [--mazes 200] [--data HELDOUT.parquet]
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import numpy as np
import torch

from bench_perception import word_probabilities
from mazerl.envs.actions import parse_action
from mazerl.mazes.dataset_io import read_split
from mazerl.mazes.layout import MOVES
from mazerl.mazes.solver import distances_from
from mazerl.policy.config import PolicyConfig
from mazerl.rollout.factory import open_policy
from mazerl.rollout.multiturn import items_from_split, rollout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-base")
    ap.add_argument("--mazes", type=int, default=200)
    ap.add_argument("--data", type=Path, help="a split parquet (default: the `default` preset's heldout, generated into "
                    "outputs/bench-first-errors/mazes)")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    data = args.data
    if data is None:
        from mazerl.mazes.splits import generate_dataset, preset
        from mazerl.mazes.visgym import reference_file

        mazes = Path("outputs/bench-first-errors/mazes")
        if not (mazes / "manifest.json").exists():
            generate_dataset(preset("default"), mazes, reference_file(), overwrite=True)
        data = mazes / "heldout.parquet"
    view = PolicyConfig.model_validate({"model": args.model})
    tp = open_policy(view)
    tp.policy.model.eval()
    df = read_split(data)
    items = items_from_split(df, range(min(args.mazes, len(df))), view.render_scale)
    trajs = rollout(tp.engine, tp.chat, items, sampling=tp.sampling(temperature=0.0), history=view.history)
    names = [tp.chat.decode_reply([w]).strip() for w in tp.reply_choices]

    first = []  # per failed episode: (sample, right moves, open neighbours, the move made, its turn, episode)
    for item, tr in zip(items, trajs):
        if tr.stats.success:
            continue
        grid, goal = item.task.maze.grid, item.task.maze.goal
        to_goal = distances_from(grid, goal)
        for turn, sample in enumerate(s for s in tr.samples() if s.n_loss_tokens):
            r, c = tr.stats.path[turn]
            opens = [m for m, (dr, dc) in MOVES.items() if not grid[r + dr, c + dc]]
            right = [m for m in opens if to_goal[r + MOVES[m][0], c + MOVES[m][1]] < to_goal[r, c]] or ["stop"]
            made = parse_action(tr.replies[turn])
            if made not in right:
                # the ways on: open neighbours other than the square it came from (all of them at the start)
                came_from = tuple(tr.stats.path[turn - 1]) if turn else None
                ways_on = [m for m in opens if (r + MOVES[m][0], c + MOVES[m][1]) != came_from]
                first.append((sample, right, len(opens), made, turn, tr, len(ways_on)))
                break
    with torch.no_grad():
        probs = torch.cat([word_probabilities(tp, [f[0] for f in first[b:b + 32]]) for b in range(0, len(first), 32)]) \
            if first else torch.zeros(0, len(names))
    p_right = np.array([float(sum(p[names.index(m)] for m in right)) for p, (_, right, *_) in zip(probs, first)])
    kinds = collections.Counter(f[2] for f in first)
    ways = collections.Counter(f[6] for f in first)
    # a bump leaves the agent where it was: the path holds the same square twice
    bumps = sum(made in MOVES and tuple(tr.stats.path[turn + 1]) == tuple(tr.stats.path[turn])
                for _, _, _, made, turn, tr, _ in first)
    result = {
        "model": args.model, "mazes": len(trajs), "successes": sum(t.stats.success for t in trajs),
        "failed_episodes": len(first),
        "first_error_by_open_neighbours": {str(k): kinds[k] for k in sorted(kinds)},
        "first_error_by_ways_on": {str(k): ways[k] for k in sorted(ways)},
        "first_error_is_a_wall_bump": bumps,
        "first_error_at_start": sum(f[4] == 0 for f in first),
        "first_error_turn_median": float(np.median([f[4] for f in first])) if first else None,
        "p_right_move_at_first_error_quantiles_10_25_50_75_90": np.quantile(p_right, [.1, .25, .5, .75, .9]).round(3).tolist()
        if first else None,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
