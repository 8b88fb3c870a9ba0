from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Output


def evaluate(model: str, mazes: Input[Dataset], heldout_mazes: int, other_mazes: int, reference_mazes: int, training_log: str,
             label: str, config: str, engine: str, model_view: str, results: Output[Dataset], metrics: Output[Metrics], report: Output[HTML], report_md: Output[Markdown]) -> float:
    """Greedy evaluation on every frozen split.

    Args:
        model: model to evaluate (path or hub id).
        mazes: the dataset from generate_mazes.
        heldout_mazes: how many heldout mazes (>= 500 for the default run).
        other_mazes: how many mazes of every other generated split.
        reference_mazes: how many of each VisGym reference split (0 = all of its fixed mazes).
        training_log: metrics.jsonl of the training run, for the curve ('' = none).
        label: what is evaluated (baseline | trained), for progress lines.
        config: the GRPO job config: baseline and trained model see the mazes as that job shows them
            (prompt, history, new tokens a turn, reply grammar), so compare can pair them.
        engine: the inference engine (hf | vllm), the profile's eval_engine: the same for both evaluations.
        model_view: a named view (visgym | mazerl) for a model without mazerl_policy.json ('' = the model's own).
        results: episodes.parquet, summary.json, reports.
        metrics: success per split.
        report: the HTML report.
        report_md: the Markdown report.
    Returns:
        Heldout success rate.
    """
    import shutil
    from pathlib import Path

    from mazerl.workflow import evaluate as run

    summary = run(model, mazes.path, results.path, heldout_mazes, other_mazes, training_log or None, reference_mazes,
                  label=f"evaluate-{label}", config=config, engine=engine,
                  model_view=model_view)
    for split, entry in summary["splits"].items():
        metrics.log_metric(f"success/{split}", entry["greedy"]["success"])
        metrics.log_metric(f"loop_rate/{split}", entry["greedy"]["loop_rate"])
    shutil.copyfile(Path(results.path) / "report.html", report.path)
    shutil.copyfile(Path(results.path) / "report.md", report_md.path)
    return summary["splits"]["heldout"]["greedy"]["success"] if "heldout" in summary["splits"] else 0.0
