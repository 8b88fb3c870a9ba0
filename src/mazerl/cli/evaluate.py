"""`mazerl eval` and `mazerl eval compare`: play frozen splits, compare two evaluations."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from pydantic import ValidationError

from .common import console, err_console, _escape, _quiet_hf, _fail, _print_rows, _progress, _run_job


eval_app = typer.Typer(help="Evaluate a policy on frozen splits (mazerl eval --help), or compare two evaluations.")


@eval_app.callback(invoke_without_command=True)
def eval_cmd(
    ctx: typer.Context,
    policy: Annotated[str, typer.Option(help="model | oracle (BFS moves) | random (uniform legal move or stop)")] = "model",
    model: Annotated[Optional[str], typer.Option(help="model directory or hub id (policy=model)")] = None,
    data: Annotated[Optional[list[Path]], typer.Option("--data", help="split parquet file; repeat for several")] = None,
    out: Annotated[Optional[Path], typer.Option(help="output directory")] = None,
    samples: Annotated[int, typer.Option(min=0, help="sampled episodes per maze on top of the greedy one (pass@k)")] = 0,
    temperature: Annotated[float, typer.Option(help="sampling temperature for --samples")] = 1.0,
    max_turns: Annotated[Optional[int], typer.Option(help="override every split's own turn budget")] = None,
    training_log: Annotated[Optional[Path], typer.Option(help="metrics.jsonl of the training run: adds its curve to the report")] = None,
    view_name: Annotated[Optional[str], typer.Option(
        "--view", help="named view (visgym | mazerl): how a model without mazerl_policy.json is shown the mazes; "
        "given for a model that has one, it wins over the file")] = None,
    render_scale: Annotated[Optional[float], typer.Option(help="override the model's saved view")] = None,
    history_turns: Annotated[Optional[int], typer.Option(help="override the model's saved view")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(help="override the model's saved view")] = None,
    seed: Annotated[int, typer.Option(help="seed for sampling and the random agent")] = 0,
    engine: Annotated[str, typer.Option(help="inference engine: hf (transformers) | vllm (needs vLLM installed)")] = "hf",
    overwrite: Annotated[bool, typer.Option(help="replace a non-empty --out")] = False,
) -> None:
    """Play every maze of the given splits; write episodes.parquet, summary.json and reports."""
    if ctx.invoked_subcommand is not None:
        return
    _quiet_hf()
    from ..config import format_validation_error
    from ..evaluation.report import eval_tables
    from ..evaluation.runner import EvalConfig, evaluate
    from ..policy.config import PolicyConfig

    if not data or out is None:
        _fail("give --data SPLIT.parquet (one or more) and --out DIR")
    if policy not in ("model", "oracle", "random"):
        _fail(f"unknown --policy {policy!r}: allowed model, oracle, random")
    if policy != "model":
        given = [f for f, v in (("--model", model), ("--view", view_name), ("--render-scale", render_scale),
                                ("--history-turns", history_turns), ("--max-new-tokens", max_new_tokens)) if v is not None]
        if given:
            _fail(f"{', '.join(given)}: used only with --policy model; the {policy} agent plays without a model")
    chosen = None
    if policy == "model":
        if model is None:
            _fail("--policy model needs --model PATH")
        from ..policy.views import choose_view

        # a named --view, else the model's mazerl_policy.json, else an error listing the views (no silent defaults)
        chosen = choose_view(model, view_name)
        if chosen.replaced is not None:
            err_console.print(f"[yellow]notice:[/] --view {chosen.name} replaces the model's own {PolicyConfig.VIEW_FILE} "
                              + _escape(str(chosen.replaced)), soft_wrap=True, highlight=False)
        hist = {"turns": history_turns, "images": 1} if history_turns is not None else None
        options = {"render_scale": render_scale, "history": hist, "max_new_tokens": max_new_tokens}
        try:
            view_cfg = PolicyConfig.for_model(model, **{**chosen.settings, **{k: v for k, v in options.items() if v is not None}})
        except ValidationError as err:
            _fail(format_validation_error(err, "(command-line options)"))
    view = view_cfg if chosen is not None else None
    if engine not in ("hf", "vllm"):
        _fail(f"unknown --engine {engine!r}: allowed hf, vllm")
    if view is not None and engine != view.engine:
        from ..rollout.factory import check_engine_available

        view = view.model_copy(update={"engine": engine})
        check_engine_available(view)
    try:
        cfg = EvalConfig(policy=policy, model=view, data=[str(d) for d in data], out=str(out), samples=samples,
                         temperature=temperature, max_turns=max_turns, seed=seed, overwrite=overwrite,
                         view_choice=chosen.record(view.view()) if chosen is not None and view is not None else None)
    except ValidationError as err:
        _fail(format_validation_error(err, "(command-line options)"))
    with _progress() as bar:
        tasks: dict[str, int] = {}

        def progress(split: str, done: int, total: int, share: float) -> None:
            key = "samples" if split.endswith(" samples") else "mazes"  # greedy counts run over all splits
            if key not in tasks:
                tasks[key] = bar.add_task(split, total=total)
            bar.update(tasks[key], completed=done, total=total, description=split)

        summary = _run_job(lambda: evaluate(cfg, progress=progress, metrics_log=training_log))
    _print_rows(f"evaluation: {policy} {model or ''}".strip(), eval_tables(summary))
    meta = summary["meta"]
    console.print(f"{meta['episodes']} episodes in {meta['seconds']:.1f} s ({meta['episodes_per_s']:.1f}/s)")
    console.print(f"report: {out / 'report.html'}", soft_wrap=True)


@eval_app.command("compare")
def eval_compare_cmd(
    base: Annotated[Path, typer.Argument(help="baseline evaluation directory")],
    new: Annotated[Path, typer.Argument(help="new evaluation directory")],
    out: Annotated[Optional[Path], typer.Option(help="write comparison.json and reports here (default: NEW)")] = None,
) -> None:
    """Paired comparison on the shared mazes: success difference (95% CI, exact McNemar), steps, loops, and the
    promotion guards (pipeline defaults: any split worse, heldout loops, wall bumps, steps/optimal)."""
    from ..atomic import write_json
    from ..evaluation.compare import compare
    from ..evaluation.report import compare_tables, guard_tables, write_compare_report
    from ..evaluation.guards import guard_settings

    result = _run_job(lambda: compare(base, new, guard_settings({})))
    target = out or new
    target.mkdir(parents=True, exist_ok=True)
    write_compare_report(target, result)
    write_json(target / "comparison.json", result)
    _print_rows("new vs base", compare_tables(result))
    _print_rows("guards (a worse new model would not be promoted)", guard_tables(result))
    console.print(f"report: {target / 'compare.html'}", soft_wrap=True)
