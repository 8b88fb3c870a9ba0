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
# The node label EKS sets to the EC2 / HyperPod instance type: node selectors name it, and the RayJob
# preflight checks that many healthy nodes of that type before launching.
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"


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


class RayJobSizing(BaseModel):
    """The RayJob's shape (backend: rayjob): a CPU head and `workers` GPU nodes, each a whole node."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    workers: int = Field(1, ge=1, le=512, description="GPU worker pods (one per node)")
    gpus_per_worker: int = Field(8, ge=1, le=16, description="nvidia.com/gpu per worker (p5.48xlarge: 8)")
    efa_per_worker: int = Field(32, ge=0, le=64, description="vpc.amazonaws.com/efa per worker (p5.48xlarge: 32; 0: none)")
    cpus_per_worker: int = Field(180, ge=1, description="CPU request per worker (leave room for the node's daemons)")
    memory_per_worker: str = Field("1800Gi", pattern=r"^[0-9]+(Ki|Mi|Gi|Ti)$")
    shm_size: str = Field("256Gi", pattern=r"^[0-9]+(Ki|Mi|Gi|Ti)$", description="/dev/shm (memory emptyDir) per worker")
    head_cpu: int = Field(8, ge=1)
    head_memory: str = Field("32Gi", pattern=r"^[0-9]+(Ki|Mi|Gi|Ti)$")
    head_node_selector: dict[str, str] = Field(default_factory=dict, description="where the CPU head runs (empty: anywhere)")
    ray_version: str = Field("2.60.0", pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$", description="the trainer image's Ray")
    active_deadline_seconds: int = Field(172800, ge=60, description="the whole job's deadline (KubeRay fails it after)")
    backoff_limit: int = Field(0, ge=0, le=10, description="KubeRay retries of a failed job (mazerl resumes from checkpoints)")
    ttl_seconds_after_finished: int = Field(3600, ge=0, description="keep the finished cluster this long (logs) before deleting it")
    metrics_port: int = Field(8080, ge=1024, le=65535, description="Ray's Prometheus metrics port on head and workers")


class SageMakerSettings(BaseModel):
    """The HyperPod cluster behind the EKS one (preflight) and the Model Registry group promotions go to."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    cluster_name: str | None = Field(None, description="HyperPod cluster name: checked for healthy nodes before a RayJob")
    model_package_group: str | None = Field(None, pattern=r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$",
                                            description="Model Registry group a promoted model is registered in")
    serving_image: str | None = Field(None, description="inference image named in the model package (pinned by digest)")
    approval_status: Literal["PendingManualApproval", "Approved"] = "PendingManualApproval"


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
    rayjob: RayJobSizing | None = Field(None, description="the RayJob's shape (required with backend: rayjob)")
    eval_gpus: int = Field(0, ge=0, le=8, description="nvidia.com/gpu for the evaluate pods with backend rayjob (an 8B model "
                           "evaluates on a GPU, not on CPU)")
    sagemaker: SageMakerSettings | None = None
    pipeline: PipelineDefaults

    @model_validator(mode="after")
    def _check(self):
        if self.kind == "hyperpod":
            missing = [f for f in ("namespace", "service_account", "kfp_host") if getattr(self, f) is None]
            if missing:
                raise ValueError(f"a hyperpod profile needs {', '.join(missing)}")
            if self.storage.fsx_claim is None:
                raise ValueError("a hyperpod profile needs storage.fsx_claim (the FSx for Lustre PVC, e.g. fsx-claim)")
        if self.backend == "rayjob":
            if self.kind != "hyperpod":
                raise ValueError("backend rayjob needs kind: hyperpod (a Kubernetes cluster with KubeRay)")
            if self.rayjob is None:
                raise ValueError("backend rayjob needs a rayjob section (workers, gpus_per_worker, efa_per_worker, ...)")
            if self.images.trainer is None:
                raise ValueError("backend rayjob needs images.trainer (the GPU image of the RayJob)")
        sm = self.sagemaker
        if self.backend == "rayjob" and sm is not None and sm.cluster_name and INSTANCE_TYPE_LABEL not in self.node_selector:
            raise ValueError(f"sagemaker.cluster_name asks for a preflight of the HyperPod cluster's GPU nodes, but "
                             f"node_selector has no {INSTANCE_TYPE_LABEL} to say which instance type the RayJob needs: "
                             "add it (e.g. ml.p5.48xlarge), or remove cluster_name to launch without the check")
        if sm is not None and sm.model_package_group and sm.serving_image is None:
            raise ValueError("sagemaker.model_package_group needs sagemaker.serving_image (the model package's container)")
        return self

    @property
    def pipeline_root(self) -> str:
        """Where KFP keeps this profile's run artifacts."""
        return f"{self.storage.root.rstrip('/')}/pipeline-root"

    def check_pinned(self) -> None:
        """Cluster images must be pinned by digest (image@sha256:...), so a run is reproducible."""
        if self.kind == "local":
            return
        serving = self.sagemaker.serving_image if self.sagemaker else None
        for field, image in (("images.runtime", self.images.runtime), ("images.trainer", self.images.trainer),
                             ("sagemaker.serving_image", serving)):
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
