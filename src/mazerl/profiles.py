"""Deployment profiles: where and how the pipeline runs, validated at the edge.

Shipped profiles are package data (mazerl/configs/profiles/<name>.yaml), so `--profile local`
works from any directory; a path to a YAML file of the same shape works too.

`local`: kfp.local on this machine, tiny model, CPU, outputs under the working directory.
`hyperpod-*`: a KFP installation on SageMaker HyperPod (EKS): pinned images, namespace, service
account, FSx for Lustre claim, S3 root, node selectors, tolerations, Kueue labels.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .config import ConfigError, format_validation_error, load_yaml_file

REPO_ROOT = Path(__file__).resolve().parents[2]  # the source checkout (images/, env/k8s/); absent in a wheel
PROFILE_DIR = Path(__file__).resolve().parent / "configs" / "profiles"
JOB_CONFIG_DIR = Path(__file__).resolve().parent / "configs" / "jobs"


def resolve_job_config(name_or_path: str) -> str:
    """A job config by name (`tiny-grpo`: mazerl/configs/jobs/tiny-grpo.yaml) or by path."""
    path = Path(name_or_path)
    if path.exists() or path.suffix in (".yaml", ".yml") or "/" in name_or_path:
        return str(path)
    shipped = JOB_CONFIG_DIR / f"{name_or_path}.yaml"
    if shipped.exists():
        return str(shipped)
    names = ", ".join(sorted(p.stem for p in JOB_CONFIG_DIR.glob("*.yaml")))
    raise ConfigError(f"unknown config {name_or_path!r}: give a YAML file or one of the shipped configs ({names})")
_PINNED = re.compile(r"^[^\s@]+@sha256:[0-9a-f]{64}$")


class Images(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    runtime: str = Field(description="image of the KFP task pods (mazerl installed, CPU)")
    trainer: str | None = Field(None, description="GPU image of the RayJob (Ray, vLLM, FSDP2)")


class Toleration(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    key: str
    operator: Literal["Exists", "Equal"] = "Exists"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


class Kueue(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    queue_name: str = Field(description="e.g. hyperpod-ns-<team>-localqueue")
    priority_class: str | None = Field(None, description="e.g. <name>-priority")


class Storage(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    root: str = Field(description="where runs, checkpoints and the promotion registry live (path or s3://)")
    fsx_claim: str | None = Field(None, description="FSx for Lustre PVC name, conventionally fsx-claim")
    fsx_mount_path: str = "/fsx"


class PipelineDefaults(BaseModel):
    """Pipeline parameter defaults of this profile (each can be overridden per run)."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    model: str = Field(description="base model: a path or hub id")
    dataset_preset: Literal["default", "smoke"] = "default"
    warm_start: bool = Field(True, description="behaviour-cloning warm start (models with no pretraining)")
    sft_config: str | None = None
    grpo_config: str
    eval_heldout_mazes: int = Field(500, ge=1)
    eval_other_mazes: int = Field(64, ge=1, description="mazes per other generated split (the VisGym reference splits: all 64)")
    min_gain: float = Field(0.0, description="promote only if success rises by more than this")
    max_p_value: float = Field(0.05, gt=0.0, le=1.0)


class Profile(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    name: str
    kind: Literal["local", "hyperpod"]
    backend: Literal["local", "ray", "rayjob"] = Field(
        "local", description="where train_grpo runs: in its task's process, on Ray from its task (RAY_ADDRESS or a Ray in "
        "the pod), or as a KubeRay RayJob")
    task_gpus: int = Field(0, ge=0, description="nvidia.com/gpu for the warm-start, train and evaluate pods (backend local on a cluster)")
    images: Images
    storage: Storage
    namespace: str | None = None
    service_account: str | None = None
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    kueue: Kueue | None = None
    kfp_host: str | None = None
    pipeline: PipelineDefaults

    @model_validator(mode="after")
    def _check(self):
        if self.kind == "hyperpod":
            missing = [f for f in ("namespace", "service_account", "kfp_host") if getattr(self, f) is None]
            if missing:
                raise ValueError(f"a hyperpod profile needs {', '.join(missing)}")
            if self.storage.fsx_claim is None:
                raise ValueError("a hyperpod profile needs storage.fsx_claim (the FSx for Lustre PVC, e.g. fsx-claim)")
        return self

    @property
    def pipeline_root(self) -> str:
        """Where KFP keeps this profile's run artifacts."""
        return f"{self.storage.root.rstrip('/')}/pipeline-root"

    def check_pinned(self) -> None:
        """Cluster images must be pinned by digest (image@sha256:...), so a run is reproducible."""
        if self.kind == "local":
            return
        for field, image in (("images.runtime", self.images.runtime), ("images.trainer", self.images.trainer)):
            if image is not None and not _PINNED.match(image):
                raise ConfigError(f"profile {self.name!r}: {field} = {image!r} is not pinned; use name@sha256:<64 hex digits>")


def available_profiles(directory: Path = PROFILE_DIR) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.yaml"))


def load_profile(name_or_path: str, directory: Path = PROFILE_DIR) -> Profile:
    """A profile by name (a shipped one: mazerl/configs/profiles/<name>.yaml) or by path to a YAML file."""
    path = Path(name_or_path)
    if not path.suffix:
        path = directory / f"{name_or_path}.yaml"
    if not path.exists():
        raise ConfigError(f"unknown profile {name_or_path!r}: available {', '.join(available_profiles(directory)) or '(none)'}")
    raw = load_yaml_file(path, "profile") or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"profile {path} must hold a mapping of settings, got {type(raw).__name__}")
    try:
        return Profile.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, str(path))) from None
