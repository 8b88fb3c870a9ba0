"""`mazerl policy ...`: build the tiny model and pretrain tiny-base."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .common import console, _quiet_hf, _fail, _train_progress, _run_job


policy_app = typer.Typer(help="Build and inspect policies (vision-language models).", no_args_is_help=True)


@policy_app.command("init-tiny")
def policy_init_tiny(
    out: Annotated[Path, typer.Option("--out", help="model directory to create")],
    size: Annotated[str, typer.Option(help="small (~2.7M parameters) | medium (~9M) | base (~3.1M, tiny-base's shape) | deep (~4.5M)")] = "small",
    seed: Annotated[int, typer.Option(help="weight initialisation seed")] = 0,
    overwrite: Annotated[bool, typer.Option(help="replace a non-empty --out")] = False,
) -> None:
    """Build a tiny random Qwen3-VL-architecture model + tokenizer + processor (HF layout)."""
    _quiet_hf()
    from ..policy.tiny import SIZES, init_tiny

    if size not in SIZES:
        _fail(f"unknown --size {size!r}: allowed {', '.join(SIZES)}")
    try:
        from ..config import check_seed

        path = init_tiny(out, size=size, seed=check_seed(seed, "--seed"), overwrite=overwrite)  # type: ignore[arg-type]
    except FileExistsError as err:
        _fail(str(err))
    from ..policy.loading import load_policy

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
    from ..config import ConfigError, load_config
    from ..mazes.visgym import reference_file
    from ..rl.pretrain import PretrainConfig, pretrain_tiny

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
        from ..atomic import check_output_dir

        check_output_dir(out, overwrite=overwrite)
    except FileExistsError as err:
        _fail(str(err))
    from ..atomic import refuse_inputs_inside

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
