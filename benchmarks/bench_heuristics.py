"""Scripted maze policies as yardsticks for the tiny model: what success does a policy with perfect
wall perception reach at VisGym-easy size (4x4-cell Wilson mazes, 18 turns) with no planning, with
one move of memory, or with a solver's move right a given fraction of the time?

tiny-base's greedy success (0.246 on 500 held-out mazes) sits where a memoryless goal-seeker does;
the policy that only refuses to undo its last move (which tiny-base's one turn of history shows it)
is the next rung. Writes OUT/heuristics.json.

    python benchmarks/bench_heuristics.py --mazes 2000 --out outputs/bench-heuristics
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from mazerl.atomic import write_json
from mazerl.evaluation.stats import wilson_interval
from mazerl.mazes.layout import MOVES
from mazerl.mazes.sampling import sample_maze
from mazerl.mazes.solver import distances_from

REVERSE = {"right": "left", "left": "right", "up": "down", "down": "up"}
CLOCKWISE = ["right", "down", "left", "up"]


def open_moves(maze, pos) -> list[str]:
    return [a for a, (dr, dc) in MOVES.items() if not maze.grid[pos[0] + dr, pos[1] + dc]]


def step(pos, action):
    dr, dc = MOVES[action]
    return pos[0] + dr, pos[1] + dc


def manhattan(maze, pos) -> int:
    return abs(pos[0] - maze.goal[0]) + abs(pos[1] - maze.goal[1])


def goal_seeker(maze, pos, last, rng):
    """No memory, no planning: the open neighbour closest to the goal as the crow flies."""
    return min(open_moves(maze, pos), key=lambda a: manhattan(maze, step(pos, a)))


def goal_seeker_no_undo(maze, pos, last, rng):
    """As goal_seeker, but never undoes the last move unless that is the only way out."""
    moves = open_moves(maze, pos)
    forward = [a for a in moves if last is None or a != REVERSE[last]] or moves
    return min(forward, key=lambda a: manhattan(maze, step(pos, a)))


def wall_follower(maze, pos, last, rng):
    """Right hand on the wall: turn right if open, else straight, else left, else back."""
    heading = CLOCKWISE.index(last or "right")
    for turn in (1, 0, -1, 2):
        action = CLOCKWISE[(heading + turn) % 4]
        if action in open_moves(maze, pos):
            return action


def noisy_solver(accuracy: float):
    def policy(maze, pos, last, rng):
        dist = distances_from(maze.grid, maze.goal)
        best = next(a for a in open_moves(maze, pos) if dist[step(pos, a)] == dist[pos] - 1)
        return best if rng.random() < accuracy else rng.choice(list(MOVES))  # a random move may hit a wall
    return policy


def play(maze, policy, rng, max_turns: int) -> bool:
    """As the environment scores it: saying `stop` on the goal square takes a turn of the budget."""
    pos, last = maze.start, None
    for _ in range(max_turns):
        if pos == maze.goal:
            return True  # this turn's reply is `stop`
        action = policy(maze, pos, last, rng)
        nxt = step(pos, action)
        if not maze.grid[nxt]:
            pos = nxt
        last = action
    return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mazes", type=int, default=2000)
    ap.add_argument("--cells", type=int, default=4)
    ap.add_argument("--max-turns", type=int, default=18)
    ap.add_argument("--seed", type=int, default=10**6, help="first maze seed (the pretraining and evaluation pools use others)")
    ap.add_argument("--out", type=Path, default=Path("outputs/bench-heuristics"))
    args = ap.parse_args()
    mazes = [sample_maze("wilson", (args.cells, args.cells), args.seed + i) for i in range(args.mazes)]
    policies = {"goal_seeker (memoryless)": goal_seeker, "goal_seeker, never undoing its last move": goal_seeker_no_undo,
                "right-hand wall follower": wall_follower,
                **{f"solver move with probability {p}, else a random move": noisy_solver(p) for p in (0.8, 0.9, 0.95)}}
    results = {}
    for name, policy in policies.items():
        rng = random.Random(0)
        wins = sum(play(m, policy, rng, args.max_turns) for m in mazes)
        results[name] = {"success": wins / len(mazes), "wilson95": wilson_interval(wins, len(mazes))}
        print(f"{wins / len(mazes):.3f}  {name}")
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "heuristics.json", {"mazes": args.mazes, "cells": args.cells, "max_turns": args.max_turns,
                                              "policies": results})


if __name__ == "__main__":
    main()
