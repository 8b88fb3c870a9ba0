"""One row per evaluated episode, and the single failure category of each failed one."""

from __future__ import annotations

from ..envs.stats import EpisodeStats

# Mutually exclusive, checked in this order (the first that applies names the failure).
FAILURE_CATEGORIES: tuple[str, ...] = (
    "format_error",  # at least half of the turns had no valid action
    "timeout_with_loop",
    "timeout_without_loop",
    "repeated_wall_bumps",  # stopped early after hitting walls 3+ times
    "premature_stop",
)
REPEATED_BUMPS = 3


def failure_category(st: EpisodeStats) -> str | None:
    """None for a success; otherwise the first category in FAILURE_CATEGORIES that applies."""
    if st.success:
        return None
    if st.turns and st.parse_failures * 2 >= st.turns:
        return "format_error"
    if st.timeout:
        return "timeout_with_loop" if st.loop else "timeout_without_loop"
    if st.wall_bumps >= REPEATED_BUMPS:
        return "repeated_wall_bumps"
    return "premature_stop"


def episode_row(maze: dict, st: EpisodeStats, *, policy: str, sample: int, greedy: bool) -> dict:
    """The per-episode record written to episodes.parquet. `maze` is the split row."""
    recoveries = st.recovery_turns
    return {
        "maze_id": maze["maze_id"],
        "split": maze["split"],
        # the layout itself, so that comparisons pair episodes by maze and never by id alone
        "layout_hash": maze["layout_hash"],
        "start": [int(x) for x in maze["start"]],
        "goal": [int(x) for x in maze["goal"]],
        "policy": policy,
        "sample": sample,
        "greedy": greedy,
        "height": int(maze["height"]),
        "width": int(maze["width"]),
        "algorithm": maze["algorithm"],
        "success": bool(st.success),
        "turns": st.turns,
        "moves": st.moves,
        "optimal_moves": st.optimal_moves,
        "max_turns": st.max_turns,
        "steps_over_optimal": (st.moves / st.optimal_moves) if st.success and st.optimal_moves else None,
        "spl": st.spl,
        "wall_bumps": st.wall_bumps,
        "revisits": st.revisits,
        "revisit_rate": st.revisit_rate,
        "loop": st.loop,
        "oscillation": st.oscillation,
        "max_visits": st.max_visits,
        "dead_end_entries": st.dead_end_entries,
        "dead_end_recovery_turns": list(recoveries),
        "mean_recovery_turns": (sum(recoveries) / len(recoveries)) if recoveries else None,
        "unrecovered_dead_end": st.unrecovered_dead_end,
        "parse_failures": st.parse_failures,
        "premature_stop": st.premature_stop,
        "timeout": st.timeout,
        "reached_goal": st.reached_goal,
        "failure_category": failure_category(st),
        "actions": list(st.actions),
        "path": [list(p) for p in st.path],
        "forks_on_solution": int(maze["forks_on_solution"]),
        "dead_ends_next_to_solution": int(maze["dead_ends_next_to_solution"]),
        "shortest_path_moves": int(maze["shortest_path_moves"]),
    }
