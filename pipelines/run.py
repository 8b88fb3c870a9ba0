"""Compile the DAG for a profile, or run it here with kfp.local."""

from __future__ import annotations

from pathlib import Path

from kfp import compiler, local

from mazerl.profiles import Profile

from .maze_pipeline import build_pipeline

# `--config smoke`: the whole DAG in a few minutes (tests); `default`: the profile's values.
RUN_CONFIGS = {
    "default": {},
    "smoke": {"dataset_preset": "smoke", "sft_steps": 20, "grpo_steps": 2, "heldout_mazes": 16, "other_mazes": 4,
              "reference_mazes": 4},
}


def latest_run(pipeline_root: str | Path) -> Path | None:
    runs = sorted(Path(pipeline_root).glob("mazerl-*"), key=lambda p: p.stat().st_mtime)
    return runs[-1] if runs else None


def compile_pipeline(profile: Profile, out: str | Path) -> Path:
    """Write the pipeline spec (IR YAML). Same profile, same bytes."""
    profile.check_pinned()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.yaml")
    compiler.Compiler().compile(build_pipeline(profile), str(tmp))
    tmp.replace(out)
    return out


def run_local(profile: Profile, pipeline_root: str | Path, arguments: dict) -> object:
    """Run the whole DAG as subprocesses of this Python (no Docker, no Kubernetes)."""
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(pipeline_root), raise_on_error=True)
    return build_pipeline(profile)(**arguments)
