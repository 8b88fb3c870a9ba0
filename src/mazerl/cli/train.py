"""`mazerl train ...`: the behaviour-cloning warm start and GRPO."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .common import console, _quiet_hf, _fail, _train_progress, _run_job


train_app = typer.Typer(help="Train a policy: behaviour-cloning warm start, then GRPO.", no_args_is_help=True)


@train_app.command("sft")
def train_sft_cmd(
    config: Annotated[Path, typer.Option("--config", help="SFT config YAML (see configs/)")],
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="override a setting: key=value (dotted keys)")] = None,
    overwrite: Annotated[bool, typer.Option(help="replace an earlier run in output_dir")] = False,
) -> None:
    """Warm start: behaviour cloning on BFS solver moves, in the multi-turn chat format."""
    _quiet_hf()
    from ..config import ConfigError, load_config, parse_overrides
    from ..rl.config import SFTConfig
    from ..rl.sft import train_sft

    try:
        cfg = load_config(SFTConfig, config, parse_overrides(set_ or []))
    except ConfigError as err:
        _fail(str(err))
    from ..rl.common import refuse_inputs_in_run_files
    from ..rl.sft import RUN_FILES

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
    from ..config import ConfigError, load_config, parse_overrides
    from ..rl.config import GRPOConfig
    from ..rl.trainer import GRPOTrainer, check_resume_arg

    if backend not in (None, "local", "ray"):
        _fail(f"unknown --backend {backend!r}: allowed local, ray")
    overrides = parse_overrides(set_ or [])
    if backend is not None:
        overrides["distributed.backend"] = backend
    try:
        cfg = load_config(GRPOConfig, config, overrides)
    except ConfigError as err:
        _fail(str(err))
    from ..rl.common import refuse_inputs_in_run_files
    from ..rl.trainer import RUN_FILES

    refuse_inputs_in_run_files(cfg, RUN_FILES, {"--config": config})
    check_resume_arg(resume, Path(cfg.output_dir) / "checkpoints")
    from ..rollout.factory import check_engine_available

    check_engine_available(cfg.policy)  # before any work: vLLM asked for where it is not installed
    if cfg.distributed.backend == "ray":
        from ..distributed.ray_grpo import RayGRPO

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
