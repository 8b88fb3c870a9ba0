"""Aggregate episodes into the numbers a reader asks for, per split and per difficulty stratum."""

from __future__ import annotations

import math

import pandas as pd

from .episodes import FAILURE_CATEGORIES
from .stats import wilson_interval


def _mean(series: pd.Series) -> float | None:
    s = series.dropna()
    return float(s.mean()) if len(s) else None


def block(df: pd.DataFrame) -> dict:
    """Headline metrics of a set of greedy episodes."""
    n = len(df)
    wins = int(df.success.sum())
    low, high = wilson_interval(wins, n)
    turns = int(df.turns.sum())
    failed = df[~df.success]
    recov = [r for rs in df.dead_end_recovery_turns for r in rs]
    return {
        "episodes": n,
        "successes": wins,
        "success": wins / n,
        "success_ci95": [low, high],
        "steps_over_optimal": _mean(df.steps_over_optimal),
        "spl": float(df.spl.mean()),
        "wall_bump_rate": float(df.wall_bumps.sum() / max(1, turns)),
        "revisit_rate": float(df.revisit_rate.mean()),
        "loop_rate": float(df.loop.mean()),
        "dead_end_entries_per_episode": float(df.dead_end_entries.mean()),
        "mean_recovery_turns": (sum(recov) / len(recov)) if recov else None,
        "unrecovered_dead_end_rate": float(df.unrecovered_dead_end.mean()),
        "parse_failure_rate": float(df.parse_failures.sum() / max(1, turns)),
        "premature_stop_rate": float(df.premature_stop.mean()),
        "timeout_rate": float(df.timeout.mean()),
        "failure_categories": {c: int((failed.failure_category == c).sum()) for c in FAILURE_CATEGORIES},
    }


def _bucket_optimal(n: int) -> str:
    lo = 2 ** int(math.log2(max(1, n)))
    return f"{lo}-{2 * lo - 1}"


STRATA = {
    "optimal_moves": lambda df: df.shortest_path_moves.map(_bucket_optimal),
    "forks_on_solution": lambda df: df.forks_on_solution.clip(upper=6).map(lambda v: f"{v}+" if v == 6 else str(v)),
    "dead_ends_next_to_solution": lambda df: df.dead_ends_next_to_solution.clip(upper=6).map(lambda v: f"{v}+" if v == 6 else str(v)),
    "size": lambda df: df.height.astype(str) + "x" + df.width.astype(str),
}


def summarise(episodes: pd.DataFrame) -> dict:
    """summary.json: per split the headline block, per-stratum blocks, and pass@k when sampled."""
    out: dict = {"splits": {}}
    for split, df in episodes.groupby("split", sort=False):
        greedy = df[df.greedy]
        entry = {"greedy": block(greedy), "strata": {}}
        for name, key in STRATA.items():
            entry["strata"][name] = {str(k): block(g) for k, g in greedy.groupby(key(greedy), sort=True)}
        sampled = df[~df.greedy]
        if len(sampled):
            per_maze = sampled.groupby("maze_id").success
            k = int(per_maze.size().max())
            solved = int(per_maze.any().sum())
            n = int(per_maze.ngroups)
            entry["sampled"] = {
                "k": k,
                "pass_at_k": solved / n,
                "pass_at_k_ci95": list(wilson_interval(solved, n)),
                "mean_success": float(sampled.success.mean()),
            }
        out["splits"][str(split)] = entry
    return out
