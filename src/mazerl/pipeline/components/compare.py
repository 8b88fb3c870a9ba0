from kfp.dsl import HTML, Dataset, Input, Metrics, Output


def compare(base: Input[Dataset], new: Input[Dataset], min_gain: float, max_p_value: float,
            result: Output[Dataset], metrics: Output[Metrics], report: Output[HTML]) -> int:
    """Paired comparison of two evaluations and the promotion decision.

    Args:
        base: the baseline evaluation.
        new: the trained model's evaluation.
        min_gain: promote only if heldout success rises by more than this.
        max_p_value: and the exact McNemar p-value is at most this.
        result: comparison.json, compare.html, compare.md.
        metrics: the decision's figures (success_diff, p_value, improved) for the pipeline UI.
        report: the comparison report (HTML).
    Returns:
        1 to promote, 0 not to: the branch reads this return value (`Output`), never a named output of a
        NamedTuple, which kfp.local cannot resolve (it then skips the branch), and a number, never a string.
    """
    import shutil
    from pathlib import Path

    from mazerl.workflow import compare as run

    outcome = run(base.path, new.path, result.path, min_gain, max_p_value)
    shutil.copyfile(Path(result.path) / "compare.html", report.path)
    d = outcome["decision"]
    for key in ("success_diff", "p_value"):
        metrics.log_metric(key, d[key])
    metrics.log_metric("improved", int(d["improved"]))
    return int(d["improved"])
