"""Compile the DAG for a profile, or run it here with kfp.local."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from kfp import compiler, local

from ..pipeline_spec import check_parameters, pipeline_defaults
from ..profiles import Profile
from ..task_logs import console_line, split_task_logs, tee_stdout

from .dag import build_pipeline

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
    from ..atomic import atomic_path
    from ..config import ConfigError

    profile.check_pinned()
    from ..cluster.plan import check_profile

    check_profile(profile)  # the profile's training job fits its GPUs, before anything is compiled or submitted
    out = Path(out)
    if out.is_dir():
        raise ConfigError(f"--out {out} is a directory; give the file to write, e.g. {out / 'mazerl-pipeline.yaml'}")
    if out.suffix.lower() not in (".yaml", ".yml", ".json"):
        raise ConfigError(f"--out {out}: the pipeline spec is written as YAML or JSON; end the name in .yaml, .yml or .json")
    # a unique temporary file beside `out` (removed on failure), renamed over it only when complete
    with atomic_path(out) as tmp:
        spec = tmp.with_name(tmp.name + out.suffix)  # kfp picks the format from the suffix
        try:
            compiler.Compiler().compile(build_pipeline(profile), str(spec))
            spec.replace(tmp)
        finally:
            spec.unlink(missing_ok=True)
    return out


def _python_in_command_only(full_command: list[str], new_executable: str) -> list[str]:
    """kfp.local's SubprocessRunner points a task at this interpreter by replacing the string `python3`
    in every element of its command line, the executor input (parameter values, artifact paths)
    included: a path such as `.../lib/python3.11/site-packages/mazerl/assets/tiny-base` came out as
    `.../lib/<interpreter>.11/...`. Only the elements before the component's own code are the command
    that starts Python; everything after it is data and is passed through untouched."""
    user_code = next((i + 1 for i, el in enumerate(full_command)
                      if '"$program_path/ephemeral_component.py"' in el and '"$@"' in el), len(full_command))
    return [el.replace("python3", new_executable) if i < user_code else el for i, el in enumerate(full_command)]


@contextmanager
def _values_passed_intact():
    from kfp.local import subprocess_task_handler

    original = subprocess_task_handler.replace_python_executable
    subprocess_task_handler.replace_python_executable = _python_in_command_only
    try:
        yield
    finally:
        subprocess_task_handler.replace_python_executable = original


def run_local(profile: Profile, pipeline_root: str | Path, arguments: dict) -> object:
    """Run the whole DAG as subprocesses of this Python (no Docker, no Kubernetes)."""
    import warnings

    # kfp.local says so for every cluster-only setting (display names, resources): expected here
    warnings.filterwarnings("ignore", message=".*have no effect in the current local runner.*")
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(pipeline_root), raise_on_error=True)
    with _values_passed_intact():
        return build_pipeline(profile)(**arguments)


def check_arguments(profile: Profile, arguments: dict, run_settings: dict | None = None) -> dict:
    """The parameter checks a submission gets (names, types, the guards' ranges and the splits they name), against
    this profile's compiled spec. `run_settings`: the run's other arguments (a run config's, the reference file),
    which decide what the guards can name."""
    from ..workflow import MODEL_VIEW_PARAMETER, check_guard_parameters, check_model_view

    with tempfile.TemporaryDirectory() as tmp:
        package = compile_pipeline(profile, Path(tmp) / "pipeline.yaml")
        checked = check_parameters(package, arguments)
        defaults = pipeline_defaults(package)
    check_guard_parameters({**defaults, **(run_settings or {}), **checked})  # a bad one: a ConfigError naming it
    check_model_view(checked.get(MODEL_VIEW_PARAMETER))  # an unknown view: a ViewError listing the views
    return checked


@dataclass
class LocalRun:
    run_dir: Path | None  # None: the run failed before kfp.local created its directory
    log: Path  # the whole run's output (<run_dir>/pipeline.log once the directory exists)
    task_logs: dict[str, Path] = field(default_factory=dict)  # task -> <run_dir>/<task>/task.log
    error: RuntimeError | None = None


# kfp.local's warnings that say nothing to a user: its condition evaluation logs this for a branch input it reads
# from another scope first (the promote branch's `compare-improved`), then carries on. What it decided is
# checked regardless: promotion_of_run fails a run whose compare decided to promote and no promote step ran.
EXPECTED_KFP_WARNINGS = ("Could not resolve parent input: ",)


class _ExpectedWarningsToLog(logging.Filter):
    """Writes kfp.local's expected warnings to standard output (the run's log, which the console does not
    show) instead of standard error; every other record passes as it was."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.name == "root" and message.startswith(EXPECTED_KFP_WARNINGS):
            print(f"{record.levelname}:kfp.local:{message} (expected; see pipelines/run.py)", file=sys.stdout, flush=True)
            return False
        return True


@contextmanager
def expected_kfp_warnings_to_log():
    """While a local run runs, kfp.local's expected warnings go to its log, not the console."""
    root = logging.getLogger()
    keep = _ExpectedWarningsToLog()
    root.addFilter(keep)
    try:
        yield
    finally:
        root.removeFilter(keep)


def run_local_logged(profile: Profile, root: Path, arguments: dict, verbose: bool = False) -> LocalRun:
    """`run_local` with its output teed to a log, then cut into one log per task beside its outputs.

    The console shows task starts/ends and the tasks' progress lines (all output with `verbose`)."""
    runs = root / "runs"
    before = set(runs.glob("mazerl-*"))
    result = LocalRun(None, root / "logs" / f"pipeline-{os.getpid()}-{int(time.time())}.log")
    with tee_stdout(result.log, show=None if verbose else console_line), expected_kfp_warnings_to_log():
        try:
            run_local(profile, runs, arguments)
        except RuntimeError as err:
            result.error = err
    new_runs = sorted(set(runs.glob("mazerl-*")) - before)
    if new_runs:
        result.run_dir = new_runs[-1]
        result.log = result.log.replace(result.run_dir / "pipeline.log")
        result.task_logs = split_task_logs(result.log, result.run_dir)
    return result


def promotion_of_run(run_dir: Path, registry_root: str) -> dict | None:
    """What the run's promote step did: the registry entry it wrote, or None when the step did not
    run. The console reports this, never compare's decision alone: a decision to promote that no
    promote step carried out is a failure, not a promotion."""
    import json

    from ..config import ConfigError
    from ..workflow import read_registry

    output = run_dir / "promote" / "executor_output.json"
    if not output.is_file():
        return None
    promoted = json.loads(output.read_text(encoding="utf-8"))["parameterValues"]["Output"]
    entry = read_registry(registry_root)
    if not entry or entry.get("model") != promoted:
        raise ConfigError(f"the promote step reported {promoted}, but the registry {registry_root} points at "
                          f"{(entry or {}).get('model', 'nothing')}: another run may have promoted since")
    return entry
