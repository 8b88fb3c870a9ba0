"""`mazerl cluster ...`: the capacity plan and the training RayJob, without touching a cluster."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from .common import console, err_console, _fail, _cluster_profile


cluster_app = typer.Typer(help="HyperPod: the capacity plan and the training RayJob (render, launch and follow, cancel).",
                          no_args_is_help=True)


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
    from ..atomic import write_text
    from ..cluster.rayjob import RayJobSpecError, build_rayjob, render
    from ..config import ConfigError, parse_overrides

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

    from ..cluster.plan import build_plan, format_plan, job_config_for_profile
    from ..config import parse_overrides

    prof = _cluster_profile(profile)
    plan = build_plan(prof, job_config_for_profile(prof, config, parse_overrides(set_ or [])))
    if json_:
        sys.stdout.write(json.dumps(plan.to_json(), indent=2) + "\n")
    else:
        console.print(format_plan(plan), markup=False, highlight=False, soft_wrap=True)
    if plan.problems:
        _fail(f"the job does not fit profile {prof.name!r}: " + "; ".join(plan.problems))
