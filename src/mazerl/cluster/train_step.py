"""The pipeline's train step with `backend: rayjob`: a small CPU pod that stages the run on FSx,
launches the distributed GRPO job as a KubeRay RayJob, follows it to the end, and hands the final
model to the rest of the DAG.

Long-lived run data lives in a run directory on FSx named by the KFP run id (checkpoints,
TensorBoard, metrics; checkpoints also on S3 when the storage root is s3://), because the task's
output artifact is pod-local and uploaded only if the task succeeds: RayJob pods could not write
there, and a retried task would lose its checkpoints. The artifact carries the final model and
`run.json`, a pointer to the run's data.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import yaml

from ..atomic import atomic_directory, write_json, write_text
from ..config import load_config
from ..profiles import INSTANCE_TYPE_LABEL, Profile

# the launcher's deadline, after the job's status.startTime: KubeRay's activeDeadlineSeconds and this
# margin (the operator checks the deadline when it reconciles, and tears the Ray cluster down after)
DEADLINE_MARGIN_S = 600


def run_directory(profile: Profile, run_id: str) -> Path:
    """`<fsx>/mazerl/runs/<run id>`: shared by the train task's pod and every RayJob pod."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "-", run_id).strip("-.") or "run"
    return Path(profile.storage.fsx_mount_path) / "mazerl" / "runs" / safe


def checkpoint_uri(profile: Profile, run_id: str) -> str | None:
    root = profile.storage.root
    return f"{root.rstrip('/')}/runs/{run_id}/checkpoints" if root.startswith("s3://") else None


def _stage(source: Path, target: Path) -> None:
    """Copy a task input onto FSx (atomically; a retry finds it complete or replaces it)."""
    with atomic_directory(target, overwrite=True) as tmp:
        shutil.copytree(source, tmp, dirs_exist_ok=True)


def stage_run(profile: Profile, run_id: str, model: str, data_dir: str, config: str, extra: dict) -> tuple[Path, Path]:
    """Inputs onto FSx and the job config written there; returns (run directory, config path)."""
    from ..rl.config import GRPOConfig

    run = run_directory(profile, run_id)
    run.mkdir(parents=True, exist_ok=True)
    _stage(Path(data_dir), run / "mazes")
    if Path(model).is_dir():  # a warm-started model (a task artifact); a hub id is fetched by the pods themselves
        _stage(Path(model), run / "base-model")
        model = str(run / "base-model")
    elif model.startswith("s3://"):  # a promoted model: onto FSx once, instead of once per Ray pod
        from ..storage import get_tree

        get_tree(model, run / "base-model")
        model = str(run / "base-model")
    overrides = {"policy.model": model, "train_data": str(run / "mazes" / "train.parquet"),
                 "eval_data": str(run / "mazes" / "heldout.parquet"), "output_dir": str(run / "grpo"), **extra}
    if (uri := checkpoint_uri(profile, run_id)) is not None:
        overrides["checkpoint_uri"] = uri
    cfg = load_config(GRPOConfig, config, overrides)  # validated here, before any pod starts
    path = run / "grpo.yaml"
    write_text(path, yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    return run, path


def train_on_rayjob(profile: Profile, run_id: str, model: str, data_dir: str, config: str, out_dir: str,
                    extra: dict | None = None, api=None, log: Callable[[str], None] = print,
                    poll_s: float = 10.0) -> tuple[str, dict]:
    """Stage, preflight, launch and follow the RayJob. Returns the final model's path on FSx (every
    later task pod mounts FSx; `out_dir`, this pod's artifact folder, is not visible to them), after
    copying the model and metrics into `out_dir` as well, for the pipeline UI's lineage."""
    from ..metrics import read_metrics
    from .launcher import RayJobLauncher, custom_objects_api
    from .rayjob import build_rayjob, check_run_id, launcher_pod_owner

    check_run_id(run_id)  # it names the run directory, the S3 prefix and the job's label: checked before any of them
    run, config_path = stage_run(profile, run_id, model, data_dir, config, extra or {})
    # owned by this pod: Kubernetes deletes the job with it, should this task be stopped past its SIGTERM handling
    owner, about_owner = launcher_pod_owner(os.environ, profile.namespace)
    manifest = build_rayjob(profile, str(config_path), run_id, owner=owner)
    if profile.sagemaker is not None and profile.sagemaker.cluster_name:
        from .sagemaker import preflight

        instance_type = profile.node_selector[INSTANCE_TYPE_LABEL]  # the profile refuses cluster_name without it
        found = preflight(profile.sagemaker.cluster_name, instance_type, profile.rayjob.workers)
        log(f"HyperPod preflight: {found['healthy_nodes']} healthy {instance_type} nodes in {found['cluster']}")
    launcher = RayJobLauncher(api or custom_objects_api(), profile.namespace, poll_s=poll_s, log=log)
    log(about_owner)
    log(f"run directory (checkpoints, TensorBoard, metrics): {run / 'grpo'}")
    log(f"TensorBoard: tensorboard --logdir {run / 'grpo' / 'tensorboard'}")
    if (uri := checkpoint_uri(profile, run_id)) is not None:
        log(f"checkpoints also at {uri}")
    # SIGTERM (KFP terminating the run: its exit handler is not run) deletes the job; the deadline counts
    # from the job's start, not from time queued in Kueue
    outcome = launcher.run(manifest, deadline_s=profile.rayjob.active_deadline_seconds + DEADLINE_MARGIN_S)
    final = run / "grpo" / "final"
    if not (final / "config.json").is_file():
        from .launcher import LauncherError

        raise LauncherError(f"RayJob {outcome.name} completed but left no model at {final}")
    hand_back(run / "grpo", out_dir, {"run_directory": str(run), "rayjob": outcome.name, "namespace": profile.namespace,
                                       "checkpoint_uri": checkpoint_uri(profile, run_id), "dashboard": outcome.dashboard_url})
    metrics = run / "grpo" / "metrics.jsonl"
    records = read_metrics(metrics) if metrics.is_file() else []
    return str(final), (records[-1] if records else {})


def hand_back(grpo_dir: Path, out_dir: str, pointer: dict) -> None:
    """A copy of a run's final model and metrics in the task's artifact folder (the pipeline UI's
    lineage), with run.json pointing at the run directory on FSx that later pods read."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _stage(grpo_dir / "final", out / "final")
    metrics = grpo_dir / "metrics.jsonl"
    if metrics.is_file():
        shutil.copyfile(metrics, out / "metrics.jsonl")
    write_json(out / "run.json", {**pointer, "tensorboard": str(grpo_dir / "tensorboard")})


def cancel_run(profile: Profile, run_id: str, api=None, log: Callable[[str], None] = print) -> list[str]:
    """The exit handler's part: delete every RayJob of this run that is still there."""
    from .launcher import RayJobLauncher, custom_objects_api
    from .rayjob import check_run_id

    check_run_id(run_id)  # it goes into a label selector: an empty or odd one would select other runs' jobs
    return RayJobLauncher(api or custom_objects_api(), profile.namespace, log=log).cancel_run(run_id)
