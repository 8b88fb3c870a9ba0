"""The `mazerl` command line. Thin: every command parses its options and calls one library function."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import click
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from typer.core import TyperGroup

from .errors import (EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated, sigterm_as_interrupt,
                     user_message, write_error_log)
from .mazes.layout import MazeError

DEBUG_ENV = "MAZERL_DEBUG"


# What click and typer report themselves (usage errors with the usage line, --help, exits): typer
# 0.2x carries its own copy of click, whose errors derive from typer.TyperException, not click's.
_PASS_THROUGH = tuple({click.exceptions.Exit, click.ClickException, click.exceptions.Abort, typer.Exit,
                       getattr(typer, "Abort", click.exceptions.Abort),
                       getattr(typer, "TyperException", click.ClickException)})


class _ErrorBoundary(TyperGroup):
    """The command line's one error boundary. Bad input (any `UserError`, a validation error, an
    unreadable or unwritable file): one message, exit 2. Anything unexpected: one line naming the
    error and a log file holding the traceback, exit 1. `--debug` (or MAZERL_DEBUG=1) also prints
    the traceback. Nobody sees a raw traceback otherwise. Ctrl-C, and SIGTERM alike, unwind (temporary
    files removed) to one line: exit 130, or 143 for SIGTERM."""

    def invoke(self, ctx: click.Context):
        try:
            with sigterm_as_interrupt():
                return super().invoke(ctx)
        except _PASS_THROUGH:
            raise
        except Terminated:
            err_console.print("[bold red]interrupted[/] (SIGTERM)", highlight=False)
            raise typer.Exit(code=EXIT_TERMINATED) from None
        except KeyboardInterrupt:
            err_console.print("[bold red]interrupted[/]", highlight=False)
            raise typer.Exit(code=EXIT_INTERRUPTED) from None
        except Exception as err:  # noqa: BLE001 - this is the boundary
            debug = bool(os.environ.get(DEBUG_ENV))
            if debug:
                err_console.print_exception(show_locals=False)
            message = user_message(err)
            if message is not None:
                err_console.print("[bold red]error:[/] " + _escape(message), soft_wrap=True, highlight=False)
                raise typer.Exit(code=EXIT_BAD_INPUT) from None
            log = write_error_log(err, sys.argv)
            where = f"; traceback in {log}" if log else ""
            err_console.print("[bold red]internal error:[/] " + _escape(f"{type(err).__name__}: {err}{where} "
                              "(rerun with --debug to print it; please report it)"), soft_wrap=True, highlight=False)
            raise typer.Exit(code=EXIT_FAILED) from None


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


app = typer.Typer(help="mazerl: multi-turn GRPO for vision-language models on mazes.", no_args_is_help=True,
                  cls=_ErrorBoundary, pretty_exceptions_enable=False)


@app.callback()
def _main_options(
    debug: Annotated[bool, typer.Option("--debug", help="print the traceback of any error (also: MAZERL_DEBUG=1)")] = False,
) -> None:
    """mazerl: multi-turn GRPO for vision-language models on mazes.

    Exit codes: 0 success; 1 a check failed or an internal error (its traceback is saved to a log
    file that the message names); 2 bad input; 130 interrupted; 143 stopped by SIGTERM.
    """
    if debug:
        os.environ[DEBUG_ENV] = "1"

mazes_app = typer.Typer(help="Generate, check and inspect maze datasets.", no_args_is_help=True)
policy_app = typer.Typer(help="Build and inspect policies (vision-language models).", no_args_is_help=True)
train_app = typer.Typer(help="Train a policy: behaviour-cloning warm start, then GRPO.", no_args_is_help=True)
app.add_typer(mazes_app, name="mazes")
app.add_typer(policy_app, name="policy")
app.add_typer(train_app, name="train")
pipeline_app = typer.Typer(help="The KFP pipeline: compile, run locally (kfp.local), submit and schedule on a KFP host.",
                            no_args_is_help=True)
app.add_typer(pipeline_app, name="pipeline")
eval_app = typer.Typer(help="Evaluate a policy on frozen splits (mazerl eval --help), or compare two evaluations.")
app.add_typer(eval_app, name="eval")
cluster_app = typer.Typer(help="HyperPod: the capacity plan and the training RayJob (render, launch and follow, cancel).",
                          no_args_is_help=True)
app.add_typer(cluster_app, name="cluster")

# Piped into a log (CI, `make demo | tee`), rich would cut tables to 80 columns; give them room.
_WIDTH = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 160
console = Console(width=_WIDTH)
err_console = Console(stderr=True, width=_WIDTH)


def _quiet_hf() -> None:
    """Our own progress bars speak for the long steps; silence transformers' per-file bars."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _fail(message: str) -> None:
    err_console.print("[bold red]error:[/] " + _escape(message), soft_wrap=True, highlight=False)
    raise typer.Exit(code=EXIT_BAD_INPUT)


def _print_rows(title: str, rows: list[list[str]]) -> None:
    """A rich table from a header row and data rows (nothing for no rows)."""
    if not rows:
        return
    table = Table(title=title)
    for col in rows[0]:
        table.add_column(col, no_wrap=col == "split")
    for r in rows[1:]:
        table.add_row(*r)
    console.print(table)


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err_console, transient=False,
    )


@mazes_app.command("generate")
def mazes_generate(
    out: Annotated[Path, typer.Option("--out", help="output directory (created; must be empty or absent)")],
    config: Annotated[Optional[Path], typer.Option("--config", help="dataset config YAML")] = None,
    preset: Annotated[Optional[str], typer.Option("--preset", help="named config: default | smoke")] = None,
    reference: Annotated[Optional[Path], typer.Option("--reference", help="VisGym-format fixture file for the reference splits")] = None,
    train_seed: Annotated[Optional[int], typer.Option(help="override the config's train_seed")] = None,
    workers: Annotated[int, typer.Option(min=1, help="processes drawing mazes (output does not depend on it)")] = 1,
    overwrite: Annotated[bool, typer.Option(help="replace a non-empty --out")] = False,
) -> None:
    """Write one parquet file per split and DIR/manifest.json."""
    from .mazes.splits import DatasetConfig, generate_dataset
    from .mazes.splits import preset as load_preset

    if (config is None) == (preset is None):
        _fail("give exactly one of --config FILE or --preset NAME (default, smoke)")
    from .atomic import refuse_inputs_inside

    refuse_inputs_inside(out, {"--config": config, "--reference": reference})
    try:
        cfg = DatasetConfig.from_yaml(config) if config else load_preset(preset)  # type: ignore[arg-type]
        if train_seed is not None:  # checked like the config's own train_seed
            cfg = DatasetConfig.model_validate({**cfg.model_dump(), "train_seed": train_seed})
        with _progress() as bar:
            tasks: dict[str, int] = {}

            def progress(split: str, done: int, total: int) -> None:
                if split not in tasks:
                    tasks[split] = bar.add_task(split, total=total)
                bar.update(tasks[split], completed=done)

            manifest = generate_dataset(cfg, out, reference, workers=workers, overwrite=overwrite, progress=progress)
    except ValidationError as err:
        from .config import format_validation_error

        _fail(format_validation_error(err, str(config or f"--preset {preset}")))
    except (MazeError, FileExistsError) as err:
        _fail(str(err))
    for notice in manifest["notices"]:
        err_console.print(f"[yellow]notice:[/] {notice}")
    _print_manifest(manifest, out)


def _print_manifest(manifest: dict, out: Path) -> None:
    import pandas as pd

    from .mazes.dataset_io import read_split

    table = Table(title=f"maze splits in {out}")
    table.add_column("split", no_wrap=True)
    table.add_column("rows", justify="right")
    table.add_column("grid")
    table.add_column("algorithms")
    table.add_column("optimal moves\nmin/median/max", no_wrap=True)
    table.add_column("content hash", no_wrap=True)
    for name, info in manifest["splits"].items():
        df: pd.DataFrame = read_split(out / info["file"])
        sizes = ", ".join(sorted({f"{h}x{w}" for h, w in zip(df.height, df.width)}))
        algos = ", ".join(sorted(df.algorithm.unique()))
        opt = df.shortest_path_moves
        table.add_row(name, str(info["rows"]), sizes, algos, f"{opt.min()}/{int(opt.median())}/{opt.max()}",
                      info["content_hash"][:8])
    console.print(table)
    console.print(f"manifest: {out / 'manifest.json'}")


@mazes_app.command("conformance")
def mazes_conformance(
    fixture: Annotated[Path, typer.Argument(help="VisGym maze_2d recording (JSON)")],
) -> None:
    """Replay a VisGym recording through our environment; exit non-zero on any mismatch."""
    from .envs.conformance import check_fixture

    try:
        results = check_fixture(fixture)
    except MazeError as err:
        _fail(str(err))
    for r in results:
        for m in r.mismatches:
            console.print(f"[red]mismatch[/] {r.env_id} seed {r.seed}: {m}")
    ok = sum(r.ok for r in results)
    steps = sum(r.steps_checked for r in results)
    console.print(f"{steps} steps checked")
    console.print(f"{ok}/{len(results)} episodes match")
    if ok != len(results):
        raise typer.Exit(code=1)


@mazes_app.command("show")
def mazes_show(
    split: Annotated[Path, typer.Argument(help="a split parquet file")],
    index: Annotated[int, typer.Option(help="row number")] = 0,
    png: Annotated[Optional[Path], typer.Option(help="also write the first frame as PNG here")] = None,
) -> None:
    """Print one maze as ASCII (and its analysis); optionally save its first frame."""
    from PIL import Image

    from .atomic import atomic_path
    from .mazes.dataset_io import read_split, row_render_options, row_to_maze
    from .mazes.render import render_ascii, render_rgb

    if png is not None:
        from .atomic import refuse_inputs_inside

        refuse_inputs_inside(png, {"the split file": split}, choose="choose another --png")
    try:
        df = read_split(split)
    except MazeError as err:
        _fail(str(err))
    if not 0 <= index < len(df):
        _fail(f"--index {index} is out of range: {split} has {len(df)} rows (0..{len(df) - 1})")
    row = df.iloc[index]
    maze = row_to_maze(row)
    console.print(f"[bold]{row['maze_id']}[/]  optimal {row['shortest_path_moves']} moves, "
                  f"max turns {row['max_turns']}, forks on route {row['forks_on_solution']}")
    console.print(render_ascii(maze.grid, maze.start, maze.goal), markup=False, highlight=False)
    if png:
        with atomic_path(png) as tmp:
            Image.fromarray(render_rgb(maze.grid, maze.start, maze.goal, row_render_options(row))).save(tmp, format="PNG")
        console.print(f"wrote {png}")


@mazes_app.command("export")
def mazes_export(
    splits: Annotated[list[Path], typer.Argument(help="split .parquet file(s), or a dataset directory (all its splits)")],
    out: Annotated[Path, typer.Option("--out", help="output directory (created; must be empty or absent)")],
    fmt: Annotated[str, typer.Option("--format", help="what reads the rows: skyrl (SkyRL's dataset rows, "
                                                       "env_class mazerl-maze)")],
    prompt: Annotated[str, typer.Option(help="system prompt in each row: full | short (the tiny model's)")] = "full",
    overwrite: Annotated[bool, typer.Option(help="replace a non-empty --out")] = False,
) -> None:
    """Write the mazes as another framework's dataset rows: one parquet file per split in --out."""
    from .integrations.export import export_splits

    try:
        written = export_splits(splits, out, fmt, overwrite=overwrite, prompt=prompt)
    except FileExistsError as err:
        _fail(str(err))
    _print_rows(f"{fmt} rows in {out}", [["split", "rows", "file", "from"]] + [
        [w.split, str(w.rows), str(w.file), str(w.source)] for w in written])


@policy_app.command("init-tiny")
def policy_init_tiny(
    out: Annotated[Path, typer.Option("--out", help="model directory to create")],
    size: Annotated[str, typer.Option(help="small (~2.7M parameters) | medium (~9M) | base (~3.1M, tiny-base's shape) | deep (~4.5M)")] = "small",
    seed: Annotated[int, typer.Option(help="weight initialisation seed")] = 0,
    overwrite: Annotated[bool, typer.Option(help="replace a non-empty --out")] = False,
) -> None:
    """Build a tiny random Qwen3-VL-architecture model + tokenizer + processor (HF layout)."""
    _quiet_hf()
    from .policy.tiny import SIZES, init_tiny

    if size not in SIZES:
        _fail(f"unknown --size {size!r}: allowed {', '.join(SIZES)}")
    try:
        from .config import check_seed

        path = init_tiny(out, size=size, seed=check_seed(seed, "--seed"), overwrite=overwrite)  # type: ignore[arg-type]
    except FileExistsError as err:
        _fail(str(err))
    from .policy.loading import load_policy

    policy = load_policy(path)
    n = sum(p.numel() for p in policy.model.parameters())
    console.print(f"tiny Qwen3-VL ({size}): {n / 1e6:.2f}M parameters, vocabulary {len(policy.tokenizer)} -> {path}")


@policy_app.command("pretrain-tiny")
def policy_pretrain_tiny(
    out: Annotated[Path, typer.Option("--out", help="model directory to create (refused if not empty, unless --overwrite)")],
    config: Annotated[Optional[Path], typer.Option("--config", help="pretraining config YAML (default: the shipped tiny-base recipe)")] = None,
    minutes: Annotated[Optional[float], typer.Option(help="stop after this much training time (> 0)")] = None,
    steps: Annotated[Optional[int], typer.Option(help="optimizer steps (overrides the config; the reproducible stopping rule)")] = None,
    reference: Annotated[Optional[Path], typer.Option(help="VisGym recording whose mazes are excluded (default: the shipped one)")] = None,
    overwrite: Annotated[bool, typer.Option(help="replace a non-empty --out")] = False,
) -> None:
    """Build the tiny Qwen3-VL model and pretrain it by behaviour cloning on solver moves (makes tiny-base)."""
    _quiet_hf()
    from .config import ConfigError, load_config
    from .mazes.visgym import reference_file
    from .rl.pretrain import PretrainConfig, pretrain_tiny

    if minutes is not None and minutes <= 0:
        _fail(f"--minutes must be > 0, got {minutes}")
    if steps is not None and steps <= 0:
        _fail(f"--steps must be >= 1, got {steps}")
    overrides = {k: v for k, v in {"minutes": minutes, "steps": steps}.items() if v is not None}
    try:
        cfg = load_config(PretrainConfig, config, overrides)
    except ConfigError as err:
        _fail(str(err))
    try:
        from .atomic import check_output_dir

        check_output_dir(out, overwrite=overwrite)
    except FileExistsError as err:
        _fail(str(err))
    from .atomic import refuse_inputs_inside

    refuse_inputs_inside(out, {"--config": config, "--reference": reference})
    ref = reference or reference_file()
    if not ref.is_file():
        _fail(f"reference file not found: {ref}")
    command = ["mazerl", "policy", "pretrain-tiny", "--out", str(out)]
    for flag, value in (("--config", config), ("--minutes", minutes), ("--steps", steps), ("--reference", reference)):
        command += [flag, str(value)] if value is not None else []
    command += ["--overwrite"] if overwrite else []
    bar, on_step = _train_progress(cfg.steps, ("loss", "move_accuracy", "validation/success"))
    with bar:
        prov = _run_job(lambda: pretrain_tiny(cfg, out, reference=ref, overwrite=overwrite, command=command,
                                             log=lambda m: bar.console.print(m, highlight=False), on_step=on_step))
    g = prov["heldout"]["greedy"]
    console.print(f"tiny-base: step {prov['shipped_step']} of {prov['steps_run']} ({prov['shipped_because']}); heldout greedy success "
                  f"{g['success']:.3f} (95% CI {g['wilson_95'][0]:.3f}-{g['wilson_95'][1]:.3f}) -> {out}", soft_wrap=True)


def _train_progress(total: int, keys: tuple[str, ...]):
    bar = _progress()
    task = bar.add_task("training", total=total)

    def on_step(step: int, record: dict) -> None:
        shown = "  ".join(f"{k.split('/')[-1]} {record[k]:.3g}" for k in keys if k in record)
        bar.update(task, completed=step, description=f"step {step}  {shown}")

    return bar, on_step


@train_app.command("sft")
def train_sft_cmd(
    config: Annotated[Path, typer.Option("--config", help="SFT config YAML (see configs/)")],
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="override a setting: key=value (dotted keys)")] = None,
    overwrite: Annotated[bool, typer.Option(help="replace an earlier run in output_dir")] = False,
) -> None:
    """Warm start: behaviour cloning on BFS solver moves, in the multi-turn chat format."""
    _quiet_hf()
    from .config import ConfigError, load_config, parse_overrides
    from .rl.config import SFTConfig
    from .rl.sft import train_sft

    try:
        cfg = load_config(SFTConfig, config, parse_overrides(set_ or []))
    except ConfigError as err:
        _fail(str(err))
    from .rl.common import refuse_inputs_in_run_files
    from .rl.sft import RUN_FILES

    refuse_inputs_in_run_files(cfg, RUN_FILES, {"--config": config})
    bar, on_step = _train_progress(cfg.steps, ("loss", "move_accuracy", "eval/success"))
    with bar:
        record = _run_job(lambda: train_sft(cfg, on_step, overwrite=overwrite))
    console.print(f"final move accuracy {record.get('move_accuracy', float('nan')):.3f}; model: {Path(cfg.output_dir) / 'final'}")


@train_app.command("grpo")
def train_grpo_cmd(
    config: Annotated[Path, typer.Option("--config", help="GRPO config YAML (see configs/)")],
    resume: Annotated[str, typer.Option(help="auto (latest complete checkpoint) | never | a checkpoint directory")] = "auto",
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="override a setting: key=value (dotted keys)")] = None,
    overwrite: Annotated[bool, typer.Option(help="with nothing to resume: replace an earlier run's files in output_dir")] = False,
    backend: Annotated[Optional[str], typer.Option(help="local (this process) | ray (ranks + rollout actors; default: the config's)")] = None,
    discard_damaged_checkpoints: Annotated[bool, typer.Option(
        "--discard-damaged-checkpoints", help="--resume auto when every checkpoint is damaged: discard them (each is named) "
        "and start over from step 0, with --overwrite; without it that run is refused")] = False,
) -> None:
    """Multi-turn GRPO: rollouts -> group advantages -> clipped policy-gradient updates."""
    _quiet_hf()
    from .config import ConfigError, load_config, parse_overrides
    from .rl.config import GRPOConfig
    from .rl.trainer import GRPOTrainer, check_resume_arg

    if backend not in (None, "local", "ray"):
        _fail(f"unknown --backend {backend!r}: allowed local, ray")
    overrides = parse_overrides(set_ or [])
    if backend is not None:
        overrides["distributed.backend"] = backend
    try:
        cfg = load_config(GRPOConfig, config, overrides)
    except ConfigError as err:
        _fail(str(err))
    from .rl.common import refuse_inputs_in_run_files
    from .rl.trainer import RUN_FILES

    refuse_inputs_in_run_files(cfg, RUN_FILES, {"--config": config})
    check_resume_arg(resume, Path(cfg.output_dir) / "checkpoints")
    from .rollout.factory import check_engine_available

    check_engine_available(cfg.policy)  # before any work: vLLM asked for where it is not installed
    if cfg.distributed.backend == "ray":
        from .distributed.ray_grpo import RayGRPO

        bar, on_step = _train_progress(cfg.steps, ("reward_mean", "success_rate", "entropy", "time/weight_sync"))
        with bar:
            record = _run_job(lambda: RayGRPO(cfg, on_step).run(resume, overwrite, discard_damaged_checkpoints))
        console.print(f"step {record.get('step')}: success {record.get('success_rate', float('nan')):.3f}; "
                      f"model: {Path(cfg.output_dir) / 'final'}")
        return
    bar, on_step = _train_progress(cfg.steps, ("reward_mean", "success_rate", "entropy", "eval/success"))
    with bar:
        record = _run_job(lambda: GRPOTrainer(cfg, on_step).run(resume, overwrite, discard_damaged_checkpoints))
    console.print(f"step {record.get('step')}: success {record.get('success_rate', float('nan')):.3f}; "
                  f"model: {Path(cfg.output_dir) / 'final'}")


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
    from .config import format_validation_error
    from .evaluation.report import eval_tables
    from .evaluation.runner import EvalConfig, evaluate
    from .policy.config import PolicyConfig

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
        from .policy.views import choose_view

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
        from .rollout.factory import check_engine_available

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
    from .atomic import write_json
    from .evaluation.compare import compare
    from .evaluation.report import compare_tables, guard_tables, write_compare_report
    from .evaluation.guards import guard_settings

    result = _run_job(lambda: compare(base, new, guard_settings({})))
    target = out or new
    target.mkdir(parents=True, exist_ok=True)
    write_compare_report(target, result)
    write_json(target / "comparison.json", result)
    _print_rows("new vs base", compare_tables(result))
    _print_rows("guards (a worse new model would not be promoted)", guard_tables(result))
    console.print(f"report: {target / 'compare.html'}", soft_wrap=True)


def _pipeline_modules():
    """The KFP adapter (mazerl.pipeline): imported only by pipeline commands, as it needs kfp."""
    try:
        from .pipeline import run as pipeline_run
    except ImportError as err:
        _fail(f"the pipeline commands need kfp: pip install 'mazerl[kfp]' ({err})")
    return pipeline_run


def _load_profile(name: str):
    from .config import ConfigError
    from .profiles import load_profile

    try:
        return load_profile(name)
    except ConfigError as err:
        _fail(str(err))


@pipeline_app.command("compile")
def pipeline_compile(
    profile: Annotated[str, typer.Option(help="profile name (env/<name>.yaml) or path")],
    out: Annotated[Path, typer.Option(help="pipeline spec to write (YAML)")],
) -> None:
    """Compile the DAG with the profile's images and cluster settings (deterministic output)."""
    from .config import ConfigError

    prof = _load_profile(profile)
    try:
        path = _pipeline_modules().compile_pipeline(prof, out)
    except ConfigError as err:
        _fail(str(err))
    console.print(f"compiled {prof.name} -> {path}")


@pipeline_app.command("run")
def pipeline_run_cmd(
    profile: Annotated[str, typer.Option(help="a local profile (env/local.yaml)")] = "local",
    config: Annotated[str, typer.Option(help="smoke (minutes) | default (the profile's values)")] = "default",
    reference: Annotated[Optional[str], typer.Option(help="VisGym reference splits: visgym (shipped, default) | none | a recording's path")] = None,
    param: Annotated[Optional[list[str]], typer.Option("--param", help="pipeline parameter override: key=value")] = None,
    verbose: Annotated[bool, typer.Option(help="show kfp.local's whole output (always kept in the run's logs)")] = False,
) -> None:
    """Run the whole DAG here with kfp.local (SubprocessRunner, no Docker, no Kubernetes)."""
    import json

    from .config import ConfigError, parse_overrides

    prof = _load_profile(profile)
    if prof.kind != "local":
        _fail(f"profile {prof.name!r} is a cluster profile: compile it, or submit it to its KFP host")
    runner = _pipeline_modules()
    if config not in runner.RUN_CONFIGS:
        _fail(f"unknown --config {config!r}: allowed {', '.join(runner.RUN_CONFIGS)}")
    try:
        overrides = runner.check_arguments(prof, parse_overrides(param or []))
    except ConfigError as err:
        _fail(str(err))
    root = Path(prof.storage.root)
    arguments = {"registry_root": str(root / "registry"), **runner.RUN_CONFIGS[config], **overrides}
    if reference is not None:
        from .workflow import resolve_reference

        resolve_reference(reference)  # a missing file: one message now, not a generate task failing and retrying
        arguments["reference"] = reference
    console.print(f"running the mazerl DAG locally (profile {prof.name}, config {config}); full logs under {root / 'runs'}",
                  soft_wrap=True, highlight=False)
    run = runner.run_local_logged(prof, root, arguments, verbose=verbose)
    if run.error is not None:
        _report_failure(run.error, run.run_dir, run.log, run.task_logs)
    run_dir = run.run_dir
    comparison = json.loads((run_dir / "compare" / "result" / "comparison.json").read_text())
    from .evaluation.report import compare_tables, guard_tables

    _print_rows("trained vs baseline (greedy, paired on the same mazes)", compare_tables(comparison))
    if comparison.get("guards"):
        _print_rows("guards (each blocks the promotion if the trained model is significantly worse)", guard_tables(comparison))
    d = comparison["decision"]
    figures = (f"heldout {d['success_diff']:+.3f}, p = {d['p_value']:.3g}; "
               f"rule: gain > {d['min_gain']} and p <= {d['max_p_value']}"
               + (f"; blocked by {', '.join(d['blocked_by'])}" if d.get("blocked_by") else "")
               + (f"; undecided (too few mazes): {', '.join(d['undecided'])}" if d.get("undecided") else ""))
    try:  # what the promote step did (its registry entry), not only what compare decided
        promoted = runner.promotion_of_run(run_dir, arguments["registry_root"])
    except ConfigError as err:
        _fail(str(err))
    if promoted:
        console.print(f"promotion: yes ({figures})", highlight=False)
        console.print(f"promoted: {promoted['model']} (registry {Path(arguments['registry_root']) / 'promoted.json'}; "
                      "the next run starts from it)", soft_wrap=True, highlight=False)
    elif d["improved"]:
        err_console.print(f"[bold red]error:[/] compare decided to promote ({_escape(figures)}), but no promote step ran: "
                          f"nothing was promoted; see {run_dir / 'pipeline.log'}", soft_wrap=True, highlight=False)
        raise typer.Exit(code=EXIT_FAILED)
    else:
        console.print(f"promotion: no ({figures})", highlight=False)
    console.print(f"report: {(run_dir / 'evaluate-2' / 'results' / 'report.html').resolve()}", soft_wrap=True)


@pipeline_app.command("rehearse")
def pipeline_rehearse_cmd(
    profile: Annotated[str, typer.Option(help="a cluster profile with a RayJob (hyperpod-p5, hyperpod-g5) or its path")],
    out: Annotated[Optional[Path], typer.Option(help="a new folder for everything the rehearsal writes "
                                                     "(default: outputs/rehearsal-<profile>-<time>)")] = None,
    cancel_after_step: Annotated[Optional[int], typer.Option(
        "--cancel-after-step", help="terminate the run (SIGTERM to the train task, as KFP does) once training wrote this step")] = None,
) -> None:
    """Rehearse a HyperPod run here: the profile's compiled DAG with kfp.local, its RayJob created in a local
    Kubernetes API and run on a local Ray with vLLM, S3 and SageMaker on moto, FSx a folder. Only the model
    (a tiny one with the real one's proportions), device, dtypes and counts change; rehearsal.json says what ran."""
    import json
    import time

    prof = _load_profile(profile)
    _pipeline_modules()
    from .rehearsal.run import rehearse

    target = out or Path("outputs") / f"rehearsal-{prof.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    record = rehearse(prof, target, cancel_after_step, log=lambda line: console.print(line, soft_wrap=True, highlight=False))
    o = record["outcome"]
    console.print(f"engine {record['engine']}, placement {record['placement']['placement']}, history "
                  f"{json.dumps(record['history'])}, weight sync {record['weight_sync']['mode']}", highlight=False)
    console.print(f"steps trained: {o['steps_trained']}; compared: {o['compared']}; decision: {o['decision']}; "
                  f"registered: {o['registered']}; RayJobs left running: {o['rayjobs_left']}; "
                  f"processes left: {len(o['processes_left'])}", highlight=False)
    console.print(f"rehearsal: {(Path(target) / 'rehearsal.json').resolve()}", soft_wrap=True, highlight=False)
    expected_end = o["terminated_after_step"] is not None if cancel_after_step is not None else o["compared"]
    if not expected_end or o["rayjobs_left"] or o["processes_left"] or record["rayjob_schema_errors"]:
        err_console.print("[bold red]error:[/] the rehearsal did not end as a shipped run must"
                          + (f" ({_escape(o['pipeline_error'])})" if o["pipeline_error"] else "")
                          + f"; see {_escape(record['logs']['pipeline'])}", soft_wrap=True, highlight=False)
        raise typer.Exit(code=EXIT_FAILED)


# ---------------------------------------------------------------------------- a KFP server

HostOpt = Annotated[Optional[str], typer.Option("--host", help="KFP API URL (default: the profile's kfp_host)")]
AuthOpt = Annotated[str, typer.Option("--auth", help="none | token (--token-file or $MAZERL_KFP_TOKEN) | kube (kubeconfig context)")]
TokenFileOpt = Annotated[Optional[Path], typer.Option("--token-file", help="file holding the bearer token (--auth token)")]
KubeContextOpt = Annotated[Optional[str], typer.Option("--kube-context", help="kubeconfig context (--auth kube; default: current)")]
KfpNamespaceOpt = Annotated[str, typer.Option("--kfp-namespace", help="namespace of the ml-pipeline service (--auth kube)")]
ExperimentOpt = Annotated[str, typer.Option("--experiment", help="KFP experiment (created if missing)")]
ParamOpt = Annotated[Optional[list[str]], typer.Option("--param", help="pipeline parameter: key=value (repeatable)")]


def _connection(prof, host, auth, token_file, kube_context, kfp_namespace):
    from .kfp_remote import Connection, KFPError, read_token, timeout_from_env

    try:
        token = read_token(token_file) if auth == "token" else None
        timeout_s = timeout_from_env()
    except KFPError as err:
        _fail(str(err))
    return Connection(host=host or (prof.kfp_host if prof else None), auth=auth, token=token,
                      kube_context=kube_context, kfp_namespace=kfp_namespace, timeout_s=timeout_s)


def _cluster_profile(name: str, runnable: bool = False):
    """A cluster profile; `runnable`: also one whose training backend this version has."""
    from .config import ConfigError
    from .workflow import check_backend

    prof = _load_profile(name)
    if prof.kind == "local":
        _fail(f"profile {prof.name!r} runs here with `mazerl pipeline run`; submit a cluster profile "
              f"({', '.join(p for p in _profile_names() if p != prof.name)})")
    if runnable:
        try:
            check_backend(prof.backend)
        except ConfigError as err:
            _fail(f"profile {prof.name!r}: {err}")
    return prof


def _profile_names() -> list[str]:
    from .profiles import available_profiles

    return available_profiles()


def _prepare_remote(prof, conn, experiment: str, param: list[str] | None, package_dir: Path):
    """Compile for the profile, then the library's preparation (parameters, upload, experiment)."""
    from .config import ConfigError, parse_overrides
    from .kfp_remote import KFPError, prepare

    try:
        package = _pipeline_modules().compile_pipeline(prof, package_dir / "pipeline.yaml")
        session, target, params = prepare(
            conn, package, parse_overrides(param or []), experiment, namespace=prof.namespace,
            pipeline_root=prof.pipeline_root, service_account=prof.service_account, description=f"mazerl, profile {prof.name}",
        )
    except (ConfigError, KFPError) as err:
        _fail(str(err))
    console.print(f"pipeline {target.pipeline_id} version {target.version_id} "
                  f"({'uploaded' if target.uploaded else 'unchanged, reused'}); experiment {experiment!r} {target.experiment_id}",
                  soft_wrap=True)
    return session, target, params


def _print_ui_link(conn, kind: str, ident: str) -> None:
    from .kfp_remote import ui_link

    link = ui_link(conn, kind, ident)
    if link:
        console.print(f"ui: {link}", soft_wrap=True)


@pipeline_app.command("submit")
def pipeline_submit(
    profile: Annotated[str, typer.Option(help="cluster profile name (env/<name>.yaml) or path")],
    host: HostOpt = None,
    experiment: ExperimentOpt = "mazerl",
    param: ParamOpt = None,
    run_name: Annotated[Optional[str], typer.Option(help="run name (default: mazerl-<profile>-<UTC time>)")] = None,
    auth: AuthOpt = "none",
    token_file: TokenFileOpt = None,
    kube_context: KubeContextOpt = None,
    kfp_namespace: KfpNamespaceOpt = "kubeflow",
) -> None:
    """Upload the pipeline (a new version only when it changed) and start one run on the KFP host."""
    import tempfile
    from datetime import datetime, timezone

    from .kfp_remote import KFPError, start_run

    prof = _cluster_profile(profile, runnable=True)
    conn = _connection(prof, host, auth, token_file, kube_context, kfp_namespace)
    name = run_name or f"mazerl-{prof.name}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"
    with tempfile.TemporaryDirectory() as tmp:
        session, target, params = _prepare_remote(prof, conn, experiment, param, Path(tmp))
        try:
            run_id = start_run(session, target, name, params)
        except KFPError as err:
            _fail(str(err))
    console.print(f"run {name!r} started: {run_id}")
    _print_ui_link(conn, "runs", run_id)


@pipeline_app.command("schedule")
def pipeline_schedule(
    profile: Annotated[str, typer.Option(help="cluster profile name (env/<name>.yaml) or path")],
    cron: Annotated[Optional[str], typer.Option(help="6-field cron, seconds first: '0 0 3 * * *' = 03:00 daily")] = None,
    every: Annotated[Optional[str], typer.Option(help="interval instead of cron: 90m, 24h, 7d (from 1m to 366d)")] = None,
    name: Annotated[Optional[str], typer.Option(help="recurring run name (default: mazerl-<profile>-retrain)")] = None,
    host: HostOpt = None,
    experiment: ExperimentOpt = "mazerl",
    param: ParamOpt = None,
    auth: AuthOpt = "none",
    token_file: TokenFileOpt = None,
    kube_context: KubeContextOpt = None,
    kfp_namespace: KfpNamespaceOpt = "kubeflow",
) -> None:
    """Recurring retraining: one run at a time, no catch-up of missed runs; each run trains on fresh mazes."""
    import tempfile

    from .kfp_remote import KFPError, create_schedule, parse_schedule

    prof = _cluster_profile(profile, runnable=True)
    try:
        schedule = parse_schedule(cron, every)
    except KFPError as err:
        _fail(str(err))
    conn = _connection(prof, host, auth, token_file, kube_context, kfp_namespace)
    name = name or f"mazerl-{prof.name}-retrain"
    with tempfile.TemporaryDirectory() as tmp:
        session, target, params = _prepare_remote(prof, conn, experiment, param, Path(tmp))
        if params.get("train_seed", -1) >= 0:
            err_console.print("[yellow]notice:[/] a fixed train_seed makes every scheduled run train on the same mazes")
        try:
            recurring_id = create_schedule(session, target, name, schedule, params)
        except KFPError as err:
            _fail(str(err))
    when = schedule.get("cron_expression") or f"every {schedule['interval_second']} s"
    console.print(f"recurring run {name!r} created: {recurring_id} ({when}; max concurrency 1, no catch-up)")
    _print_ui_link(conn, "recurringrun", recurring_id)


@pipeline_app.command("list")
def pipeline_list(
    profile: Annotated[str, typer.Option(help="cluster profile (its kfp_host and namespace)")],
    host: HostOpt = None,
    experiment: Annotated[Optional[str], typer.Option(help="only this experiment's recurring runs")] = None,
    auth: AuthOpt = "none",
    token_file: TokenFileOpt = None,
    kube_context: KubeContextOpt = None,
    kfp_namespace: KfpNamespaceOpt = "kubeflow",
) -> None:
    """List the recurring runs (id, name, schedule, enabled)."""
    from .kfp_remote import KFPError, connect, find_experiment, list_schedules

    prof = _cluster_profile(profile)
    conn = _connection(prof, host, auth, token_file, kube_context, kfp_namespace)
    try:
        session = connect(conn)
        namespace = session.namespace(prof.namespace)
        experiment_id = None
        if experiment is not None:
            experiment_id = find_experiment(session, experiment, namespace)
            if experiment_id is None:
                _fail(f"no experiment named {experiment!r} on {conn.where()}")
        rows = list_schedules(session, namespace, experiment_id)
    except KFPError as err:
        _fail(str(err))
    if not rows:
        console.print("no recurring runs")
        return
    # one line per recurring run, never wrapped, so it can be read by eye and by scripts alike
    lines = [("id", "name", "schedule", "enabled", "created")] + [
        (r.id, r.name, r.trigger, "yes" if r.enabled else "no", r.created) for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(5)]
    for line in lines:
        console.print("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip(), soft_wrap=True, highlight=False, markup=False)


@pipeline_app.command("disable")
def pipeline_disable(
    recurring_run_id: Annotated[str, typer.Argument(help="id shown by `mazerl pipeline list`")],
    profile: Annotated[str, typer.Option(help="cluster profile (its kfp_host)")],
    host: HostOpt = None,
    auth: AuthOpt = "none",
    token_file: TokenFileOpt = None,
    kube_context: KubeContextOpt = None,
    kfp_namespace: KfpNamespaceOpt = "kubeflow",
) -> None:
    """Stop a recurring run from starting new runs (it stays listed; runs in flight finish)."""
    from .kfp_remote import KFPError, connect, disable_schedule

    prof = _cluster_profile(profile)
    conn = _connection(prof, host, auth, token_file, kube_context, kfp_namespace)
    try:
        disable_schedule(connect(conn), recurring_run_id)
    except KFPError as err:
        _fail(str(err))
    console.print(f"recurring run {recurring_run_id} disabled")


@pipeline_app.command("rbac")
def pipeline_rbac(
    profile: Annotated[str, typer.Option(help="cluster profile (its namespace and service account)")],
    iam_role_arn: Annotated[Optional[str], typer.Option(help="IAM role for the service account (IRSA: S3, SageMaker)")] = None,
    out: Annotated[Optional[Path], typer.Option(help="write here instead of standard output")] = None,
) -> None:
    """ServiceAccount, Role and RoleBinding that let the pipeline's pods run RayJobs: `kubectl apply -f`."""
    from .atomic import write_text
    from .cluster_rbac import rbac_manifests, render

    prof = _cluster_profile(profile)
    text = render(rbac_manifests(prof, iam_role_arn))
    if out is None:
        sys.stdout.write(text)
        return
    write_text(out, text)
    err_console.print(f"wrote {out}: kubectl apply -f {out}")


@cluster_app.command("render-rayjob")
def cluster_render_rayjob(
    profile: Annotated[str, typer.Option(help="a hyperpod profile with backend rayjob and a rayjob section")],
    config: Annotated[Optional[str], typer.Option(help="GRPO job config as the pods see it: a shipped name or a path on "
                                                  "FSx, readable here too: it is validated with the --set overrides "
                                                  "before anything is rendered (default: the profile's "
                                                  "pipeline.grpo_config)")] = None,
    run_id: Annotated[str, typer.Option(help="the KFP run this job belongs to (names and labels derive from it)")] = "manual",
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="extra KEY=VALUE for the training config")] = None,
    out: Annotated[Optional[Path], typer.Option(help="write here instead of standard output")] = None,
) -> None:
    """Print the training RayJob without touching a cluster (review it, or `kubectl apply -f` it)."""
    from .atomic import write_text
    from .cluster.rayjob import RayJobSpecError, build_rayjob, render
    from .config import ConfigError, parse_overrides

    prof = _cluster_profile(profile)
    try:
        extra = parse_overrides(set_ or [])
        manifest = build_rayjob(prof, config or prof.pipeline.grpo_config, run_id, extra_overrides=extra)
    except (RayJobSpecError, ConfigError) as err:
        _fail(str(err))
    text = render(manifest)
    if out is None:
        sys.stdout.write(text)
        return
    write_text(out, text)
    err_console.print(f"wrote {out}: kubectl apply -f {out}")


@cluster_app.command("plan")
def cluster_plan(
    profile: Annotated[str, typer.Option(help="a GPU profile (hyperpod-*): its instance type names the GPUs")],
    config: Annotated[Optional[str], typer.Option(help="GRPO job config: a shipped name or a path (default: the profile's "
                                                  "pipeline.grpo_config with its pipeline.model)")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="override a setting of the job config: KEY=VALUE")] = None,
    json_: Annotated[bool, typer.Option("--json", help="print the plan as JSON (bytes and seconds)")] = False,
) -> None:
    """The capacity plan: parameters, per-GPU memory term by term, vLLM's per-prompt limits, weight-sync and
    checkpoint bytes. Exit 2, naming each setting and the number it needs, when the job does not fit."""
    import json

    from .cluster.plan import build_plan, format_plan, job_config_for_profile
    from .config import parse_overrides

    prof = _cluster_profile(profile)
    plan = build_plan(prof, job_config_for_profile(prof, config, parse_overrides(set_ or [])))
    if json_:
        sys.stdout.write(json.dumps(plan.to_json(), indent=2) + "\n")
    else:
        console.print(format_plan(plan), markup=False, highlight=False, soft_wrap=True)
    if plan.problems:
        _fail(f"the job does not fit profile {prof.name!r}: " + "; ".join(plan.problems))


def _report_failure(error: RuntimeError, run_dir: Path | None, log: Path, task_logs: dict[str, Path]) -> None:
    """Which task failed, the end of its log, where the full log is, and what the other tasks left."""
    from .task_logs import failed_task, tail, task_error

    task = failed_task(str(error))
    lines = [f"the pipeline failed: task {task!r} did not finish" if task else f"the pipeline failed: {error}"]
    if task and task in task_logs and (cause := task_error(task_logs[task])):
        lines.insert(1, f"its error: {cause}")
    if task and task in task_logs:
        console.print(f"[bold]last lines of {task}:[/]", highlight=False)
        console.print(tail(task_logs[task]), markup=False, highlight=False, soft_wrap=True)
        lines.append(f"its log: {task_logs[task]}")
    lines.append(f"whole run log: {log}")
    done = sorted(t for t in task_logs if t != task)
    if run_dir is not None:
        lines.append(f"outputs of the tasks that ran ({', '.join(done) or 'none'}): {run_dir}")
    _fail("\n".join(lines))


def _run_job(fn):
    from .policy.loading import PolicyLoadError

    try:
        return fn()
    except (PolicyLoadError, MazeError, FileExistsError) as err:
        _fail(str(err))


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
