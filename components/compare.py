from kfp.dsl import HTML, Dataset, Input, Metrics, Output


def compare(base: Input[Dataset], new: Input[Dataset], min_gain: float, max_p_value: float, guards: bool,
            guard_p_value: float, guard_margin: float, guard_success_tolerance: float, guard_loop_tolerance: float,
            guard_wall_bump_tolerance: float, guard_steps_tolerance: float, guard_splits: str,
            guard_loop_splits: str,
            result: Output[Dataset], metrics: Output[Metrics], report: Output[HTML]) -> int:
    """Paired comparison of two evaluations and the promotion decision.

    Args:
        base: the baseline evaluation.
        new: the trained model's evaluation.
        min_gain: promote only if heldout success rises by more than this.
        max_p_value: and the exact McNemar p-value is at most this.
        guards: check the guard metrics too (mazerl.evaluation.guards): a guard that finds the new model
            worse blocks the promotion.
        guard_p_value: a worsening this significant (paired test) blocks.
        guard_margin: a guard is decided when its 95% interval rules out a worsening of tolerance + margin.
        guard_success_tolerance: drop in any split's success rate allowed.
        guard_loop_tolerance: rise in heldout loop rate allowed.
        guard_wall_bump_tolerance: rise in heldout wall bumps per turn allowed.
        guard_steps_tolerance: rise in heldout steps/optimal (mazes both solve) allowed.
        guard_splits: splits whose success is guarded, comma-separated ('' = every evaluated split).
        guard_loop_splits: splits whose loop rate is guarded, comma-separated ('' = every evaluated split).
        result: comparison.json, compare.html, compare.md.
        metrics: the decision's figures (success_diff, p_value, improved, guards_blocking, each guard's
            pass/fail as guard/<name>) for the pipeline UI.
        report: the comparison report (HTML).
    Returns:
        1 to promote, 0 not to: the branch reads this return value (`Output`), never a named output of a
        NamedTuple, which kfp.local cannot resolve (it then skips the branch), and a number, never a string.
    """
    import shutil
    from pathlib import Path

    from mazerl.workflow import compare as run

    guard_values = {"guards": guards, "guard_p_value": guard_p_value, "guard_margin": guard_margin,
                    "guard_success_tolerance": guard_success_tolerance, "guard_loop_tolerance": guard_loop_tolerance,
                    "guard_wall_bump_tolerance": guard_wall_bump_tolerance, "guard_steps_tolerance": guard_steps_tolerance,
                    "guard_splits": guard_splits, "guard_loop_splits": guard_loop_splits}
    outcome = run(base.path, new.path, result.path, min_gain, max_p_value, guard_values)
    shutil.copyfile(Path(result.path) / "compare.html", report.path)
    d = outcome["decision"]
    for key in ("success_diff", "p_value"):
        metrics.log_metric(key, d[key])
    metrics.log_metric("improved", int(d["improved"]))
    metrics.log_metric("guards_blocking", len(d["blocked_by"]))
    for g in outcome["guards"]:
        metrics.log_metric(f"guard/{g['name']}", 1 if g["passed"] else 0)
    return int(d["improved"])
