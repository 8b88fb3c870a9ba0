from kfp.dsl import HTML, Dataset, Input, Output
from typing import NamedTuple


def compare(base: Input[Dataset], new: Input[Dataset], min_gain: float, max_p_value: float,
            result: Output[Dataset], report: Output[HTML]) -> NamedTuple("Decision", [("success_diff", float), ("p_value", float), ("improved", int)]):
    """Paired comparison of two evaluations and the promotion decision.

    Args:
        base: the baseline evaluation.
        new: the trained model's evaluation.
        min_gain: promote only if heldout success rises by more than this.
        max_p_value: and the exact McNemar p-value is at most this.
        result: comparison.json, compare.html, compare.md.
        report: the comparison report (HTML).
    Returns:
        success_diff, p_value, improved (1 or 0: the pipeline branches on a number, never a string).
    """
    import shutil
    from collections import namedtuple
    from pathlib import Path

    from mazerl.workflow import compare as run

    outcome = run(base.path, new.path, result.path, min_gain, max_p_value)
    shutil.copyfile(Path(result.path) / "compare.html", report.path)
    d = outcome["decision"]
    return namedtuple("Decision", ["success_diff", "p_value", "improved"])(d["success_diff"], d["p_value"], int(d["improved"]))
