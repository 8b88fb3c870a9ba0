"""`mazerl eval compare BASE NEW`: paired differences on the mazes both evaluations played."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from ..mazes.dataset_io import maze_key
from ..mazes.layout import MazeError
from .guards import GuardSettings, evaluate_guards
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


def _keyed(episodes: pd.DataFrame, where: str | Path) -> pd.DataFrame:
    """Greedy episodes indexed by their maze: layout hash, start and goal (ids are only row numbers)."""
    missing = [c for c in ("layout_hash", "start", "goal") if c not in episodes.columns]
    if missing:
        raise MazeError(f"{where} was written by an older mazerl (its episodes lack {', '.join(missing)}); "
                        "evaluate again to compare it")
    g = episodes[episodes.greedy].copy()
    g["maze_key"] = [maze_key(h, s, e) for h, s, e in zip(g.layout_hash, g.start, g.goal)]
    return g


def _check_same_settings(base_dir: Path, new_dir: Path) -> None:
    """Refuse to compare evaluations played under different rules (turn budget override, model view) or by
    different inference engines."""
    metas = []
    for d in (base_dir, new_dir):
        summary = Path(d) / "summary.json"
        try:
            saved = json.loads(summary.read_text(encoding="utf-8")) if summary.exists() else {}
        except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
            raise MazeError(f"{summary} is not a JSON summary ({err}); it is damaged: evaluate again") from None
        if not isinstance(saved, dict):
            raise MazeError(f"{summary} is not a JSON object; it is damaged: evaluate again")
        metas.append(saved.get("meta", {}))
    a, b = metas
    if a.get("max_turns_override") != b.get("max_turns_override"):
        raise MazeError(f"the evaluations used different turn budgets (--max-turns {a.get('max_turns_override')} vs "
                        f"{b.get('max_turns_override')}): a comparison needs the same budget")
    ea, eb = a.get("engine"), b.get("engine")
    if ea is not None and eb is not None and ea != eb:  # older summaries record none: not refused
        raise MazeError(f"the evaluations were played by different inference engines ({ea} vs {eb}): their kernels "
                        "round differently, so greedy episodes can differ for the same model; evaluate both with the same "
                        "engine to compare them")
    va, vb = a.get("view"), b.get("view")
    if va is not None and vb is not None and va != vb:
        diff = sorted(k for k in set(va) | set(vb) if va.get(k) != vb.get(k))
        raise MazeError(f"the two models saw the mazes differently ({', '.join(f'{k}: {va.get(k)!r} vs {vb.get(k)!r}' for k in diff)}): "
                        "evaluate both with the same view settings to compare them")


def compare(base_dir: str | Path, new_dir: str | Path, guards: GuardSettings | None = None) -> dict:
    """Every shared split's paired figures, and with `guards` the guard records (`evaluation.guards`)."""
    base_dir, new_dir = Path(base_dir), Path(new_dir)
    base = _keyed(load_episodes(base_dir), base_dir)
    new = _keyed(load_episodes(new_dir), new_dir)
    _check_same_settings(base_dir, new_dir)
    out: dict = {"base": str(base_dir), "new": str(new_dir), "splits": {}}
    splits = [s for s in base.split.unique() if s in set(new.split.unique())]
    if not splits:
        raise MazeError(f"{base_dir} and {new_dir} share no split: nothing to compare")
    paired: dict[str, tuple[pd.DataFrame, pd.DataFrame]] = {}
    for split in splits:
        a = base[base.split == split].set_index("maze_key")
        b = new[new.split == split].set_index("maze_key")
        for name, side in (("base", a), ("new", b)):
            if side.index.duplicated().any():
                raise MazeError(f"split {split!r} holds the same maze (walls, start and goal) more than once in {name}: "
                                "its episodes cannot be paired one to one")
        if set(a.index) != set(b.index):
            only_a, only_b = sorted(set(a.index) - set(b.index)), sorted(set(b.index) - set(a.index))
            raise MazeError(
                f"split {split!r}: the evaluations played different mazes ({len(only_a)} layouts only in base, "
                f"{len(only_b)} only in new, compared by walls, start and goal, not by maze id); compare evaluations "
                "of the same split file"
            )
        b = b.loc[a.index]
        paired[split] = (a, b)
        budgets = a.max_turns.to_numpy() != b.max_turns.to_numpy()
        if budgets.any():
            k = int(budgets.argmax())
            raise MazeError(f"split {split!r}: maze {a.maze_id.iloc[k]!r} was played with {int(a.max_turns.iloc[k])} turns in "
                            f"base and {int(b.max_turns.iloc[k])} in new: a comparison needs the same turn budgets")
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
    if guards is not None:
        out["guards"] = evaluate_guards(paired, guards)
    return out
