"""`mazerl eval compare BASE NEW`: paired differences on the mazes both evaluations played."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ..mazes.layout import MazeError
from .runner import load_episodes
from .stats import Z95, mcnemar_exact, paired_comparison


def _paired_mean_diff(a: pd.Series, b: pd.Series) -> dict | None:
    """Mean of b - a with a normal-approximation 95% interval (None with fewer than 2 pairs)."""
    d = (b - a).dropna()
    if len(d) < 2:
        return None
    sd = float(d.std(ddof=1))
    half = Z95 * sd / math.sqrt(len(d))
    m = float(d.mean())
    return {"pairs": int(len(d)), "diff": m, "ci95": [m - half, m + half]}


def compare(base_dir: str | Path, new_dir: str | Path) -> dict:
    base = load_episodes(base_dir)
    new = load_episodes(new_dir)
    base, new = base[base.greedy], new[new.greedy]
    out: dict = {"base": str(base_dir), "new": str(new_dir), "splits": {}}
    splits = [s for s in base.split.unique() if s in set(new.split.unique())]
    if not splits:
        raise MazeError(f"{base_dir} and {new_dir} share no split: nothing to compare")
    for split in splits:
        a = base[base.split == split].set_index("maze_id")
        b = new[new.split == split].set_index("maze_id")
        if set(a.index) != set(b.index):
            only_a, only_b = sorted(set(a.index) - set(b.index)), sorted(set(b.index) - set(a.index))
            raise MazeError(
                f"split {split!r}: the evaluations played different mazes ({len(only_a)} only in base, e.g. "
                f"{only_a[:3]}; {len(only_b)} only in new, e.g. {only_b[:3]}); compare evaluations of the same split file"
            )
        b = b.loc[a.index]
        pc = paired_comparison(list(a.success), list(b.success))
        loops_only_a = int((a.loop & ~b.loop).sum())
        loops_only_b = int((b.loop & ~a.loop).sum())
        both = a.success & b.success
        out["splits"][split] = {
            "mazes": pc.n,
            "success_base": pc.base_rate,
            "success_new": pc.new_rate,
            "success_diff": pc.diff,
            "success_diff_ci95": [pc.diff_low, pc.diff_high],
            "mcnemar_p": pc.p_value,
            "only_base_solved": pc.only_base,
            "only_new_solved": pc.only_new,
            "steps_over_optimal_diff": _paired_mean_diff(a.steps_over_optimal[both], b.steps_over_optimal[both]),
            "loop_rate_base": float(a.loop.mean()),
            "loop_rate_new": float(b.loop.mean()),
            "loop_diff": float(b.loop.mean() - a.loop.mean()),
            "loop_mcnemar_p": mcnemar_exact(loops_only_a, loops_only_b),
        }
    return out
