"""Deployment profiles: where and how the pipeline runs, validated at the edge.

Shipped profiles are package data (mazerl/configs/profiles/<name>.yaml), so `--profile local`
works from any directory; a path to a YAML file of the same shape works too.

`local`: kfp.local on this machine, tiny model, CPU, outputs under the working directory.
`hyperpod-*`: a KFP installation on SageMaker HyperPod (EKS): pinned images, namespace, service
account, FSx for Lustre claim, S3 root, node selectors, tolerations, Kueue labels.
"""

from __future__ import annotations

import posixpath
import re
import unicodedata
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from .config import ConfigError, format_validation_error, load_yaml_file

REPO_ROOT = Path(__file__).resolve().parents[2]  # the source checkout (images/, env/k8s/); absent in a wheel
PROFILE_DIR = Path(__file__).resolve().parent / "configs" / "profiles"


# ---- Kubernetes and AWS names: one rule per kind of value, applied wherever that kind is read --------
# Each check returns the value or raises ValueError naming the value and the rule (pydantic adds the
# field). Patterns are matched with re.fullmatch: `$` would also match before a trailing newline.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")  # a label value, a label key's name part
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]*[a-z0-9]")
_IPV4 = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+")
# the prefixes and suffixes AWS reserves for its own bucket kinds (access point aliases, directory buckets, ...)
_BUCKET_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_BUCKET_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
# arn:<partition>:iam::<account>:role/<path/>name: a path of printable ASCII, a name of <= 64 [\w+=,.@-]
_IAM_ROLE_ARN = re.compile(r"arn:aws[a-z-]*:iam::[0-9]{12}:role/([\x21-\x7e]*/)?[A-Za-z0-9_+=,.@-]{1,64}")
# the distribution/reference grammar Docker, containerd and ECR parse: [registry[:port]/]path[:tag][@digest]
_IMAGE_REF = re.compile(
    r"(?:(?P<registry>(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])(?:\.(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*"
    r"[A-Za-z0-9]))*(?::[0-9]+)?|\[[0-9A-Fa-f:]+\](?::[0-9]+)?)/)?"
    r"(?P<path>[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,}))?")
# the digest algorithms OCI registers, with the exact form of their hex part
_DIGEST_HEX = {"sha256": re.compile(r"[0-9a-f]{64}"), "sha512": re.compile(r"[0-9a-f]{128}")}


def check_dns_label(value: str) -> str:
    """An RFC 1123 DNS label, as Kubernetes names namespaces."""
    if len(value) > 63 or not _DNS_LABEL.fullmatch(value):
        raise ValueError(f"{value!r} is not a valid DNS label (RFC 1123): 1-63 characters, lowercase letters, digits "
                         "and '-', starting and ending with a letter or digit")
    return value


def check_dns_subdomain(value: str, max_length: int = 253) -> str:
    """An RFC 1123 DNS subdomain, as Kubernetes names most objects (service accounts, claims, classes)."""
    if len(value) > max_length or not _DNS_SUBDOMAIN.fullmatch(value):
        raise ValueError(f"{value!r} is not a valid DNS subdomain (RFC 1123): 1-{max_length} characters, lowercase "
                         "letters, digits, '-' and '.', each dot-separated part starting and ending with a letter or digit")
    return value


def check_label_value(value: str) -> str:
    """A Kubernetes label value (also a node-selector or toleration value); may be empty."""
    if len(value) > 63 or (value and not _LABEL_NAME.fullmatch(value)):
        raise ValueError(f"{value!r} is not a valid Kubernetes label value: at most 63 characters, letters, digits, "
                         "'-', '_' and '.', starting and ending with a letter or digit (or empty)")
    return value


def check_qualified_name(value: str) -> str:
    """A Kubernetes qualified name (a label, node-selector or taint key): [DNS-subdomain prefix '/'] name."""
    prefix, slash, name = value.rpartition("/")
    if (len(name) > 63 or not _LABEL_NAME.fullmatch(name)
            or (slash and (len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)))):
        raise ValueError(f"{value!r} is not a valid Kubernetes qualified name (label key): an optional DNS-subdomain "
                         "prefix (<= 253 lowercase characters) and '/', then a name of 1-63 letters, digits, '-', '_' "
                         "and '.', starting and ending with a letter or digit")
    return value


def check_bucket_name(value: str) -> str:
    """An S3 general purpose bucket name, by AWS's naming rules."""
    rule = ("3-63 lowercase letters, digits, '.' and '-', beginning and ending with a letter or digit, not an IP "
            "address, no '..', no reserved prefix (xn--, sthree-, amzn-s3-demo-) or suffix (-s3alias, --ol-s3, .mrap, "
            "--x-s3, --table-s3)")
    why = None
    if not 3 <= len(value) <= 63:
        why = f"it has {len(value)} characters"
    elif not re.fullmatch(r"[a-z0-9.-]+", value):
        why = "only lowercase letters, digits, '.' and '-' are allowed"
    elif not _BUCKET.fullmatch(value):
        why = "it must begin and end with a letter or digit"
    elif ".." in value:
        why = "it contains '..'"
    elif _IPV4.fullmatch(value):
        why = "it is formatted as an IP address"
    elif value.startswith(_BUCKET_RESERVED_PREFIXES) or value.endswith(_BUCKET_RESERVED_SUFFIXES):
        why = "it has a prefix or suffix AWS reserves"
    if why:
        raise ValueError(f"{value!r} is not a valid S3 bucket name ({why}): {rule}")
    return value


def _has_control_characters(value: str) -> bool:
    return any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in value)


def check_storage_root(value: str) -> str:
    """A local path (FSx, the working directory) or s3://<bucket>[/prefix] with a valid bucket name."""
    if value.startswith("s3://"):
        check_bucket_name(value[len("s3://"):].partition("/")[0])
    if _has_control_characters(value):
        raise ValueError(f"{value!r} contains control characters (a newline?): give a path or s3://bucket/prefix")
    return value


def check_absolute_path(value: str) -> str:
    """An absolute, normalized POSIX path below / (a volume's mount path in a pod)."""
    rule = "an absolute, normalized path such as /fsx (no '..', '.', '//' or trailing '/')"
    if _has_control_characters(value) or any(c.isspace() for c in value):
        raise ValueError(f"{value!r} contains control characters or spaces: {rule}")
    if ".." in value.split("/"):
        raise ValueError(f"{value!r} contains '..': {rule}")
    if not value.startswith("/"):
        raise ValueError(f"{value!r} is not absolute: {rule}")
    if value == "/":
        raise ValueError(f"{value!r} is the root directory; a volume mounted there would hide the image: {rule}")
    if posixpath.normpath(value) != value or value.startswith("//"):
        raise ValueError(f"{value!r} is not normalized (it is {posixpath.normpath(value)!r}): {rule}")
    return value


def check_iam_role_arn(value: str) -> str:
    """The ARN of an IAM role (IRSA): arn:aws[-partition]:iam::<account>:role/[path/]name."""
    if len(value) > 2048 or not _IAM_ROLE_ARN.fullmatch(value):
        raise ValueError(f"{value!r} is not an IAM role ARN: arn:aws:iam::<12-digit account id>:role/[path/]name (a "
                         "partition such as aws-cn or aws-us-gov instead of aws; a name of 1-64 letters, digits and "
                         "_+=,.@-)")
    return value


def check_image_ref(value: str) -> str:
    """A container image reference: [registry[:port]/]name[:tag][@algorithm:digest], lowercase name."""
    m = _IMAGE_REF.fullmatch(value)
    algorithm, _, hex_part = (m.group("digest") or "").partition(":") if m else ("", "", "")
    if (m is None or len(m.group("path")) + len(m.group("registry") or "") > 255
            or (algorithm in _DIGEST_HEX and not _DIGEST_HEX[algorithm].fullmatch(hex_part))):
        raise ValueError(f"{value!r} is not a valid container image reference: [registry[:port]/]name[:tag][@sha256:"
                         "<64 hex digits>], lowercase name components, no spaces")
    return value


def is_pinned(image: str) -> bool:
    """Pinned by a sha256 digest (image@sha256:<64 hex>): the image a run used can be pulled again."""
    match = _IMAGE_REF.fullmatch(image)
    algorithm, _, hex_part = (match.group("digest") or "").partition(":") if match else ("", "", "")
    return algorithm == "sha256" and bool(_DIGEST_HEX["sha256"].fullmatch(hex_part))


DNSLabel = Annotated[str, AfterValidator(check_dns_label)]
DNSSubdomain = Annotated[str, AfterValidator(check_dns_subdomain)]
# an object named in a label too (Kueue's queue-name and priority-class labels): a DNS subdomain of <= 63
LabelledName = Annotated[str, AfterValidator(lambda v: check_dns_subdomain(v, max_length=63))]
LabelValue = Annotated[str, AfterValidator(check_label_value)]
QualifiedName = Annotated[str, AfterValidator(check_qualified_name)]
StorageRoot = Annotated[str, AfterValidator(check_storage_root)]
AbsolutePath = Annotated[str, AfterValidator(check_absolute_path)]
ImageRef = Annotated[str, AfterValidator(check_image_ref)]
# The node label EKS sets to the EC2 / HyperPod instance type: node selectors name it, and the RayJob
# preflight checks that many healthy nodes of that type before launching.
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"


class Images(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    runtime: ImageRef = Field(description="image of the KFP task pods (mazerl installed, CPU)")
    trainer: ImageRef | None = Field(None, description="GPU image of the RayJob (Ray, vLLM, FSDP2)")


class Toleration(BaseModel):
    """A Kubernetes toleration, checked as the API server checks one."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    key: QualifiedName | None = Field(None, description="the taint key (none, with operator Exists: every taint)")
    operator: Literal["Exists", "Equal"] = "Exists"
    value: LabelValue | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute", ""] | None = Field(None, description="empty: all effects")

    @model_validator(mode="after")
    def _check(self):
        if self.operator == "Exists" and self.value:
            raise ValueError(f"operator Exists matches any value of the taint; remove value {self.value!r} or use "
                             "operator Equal")
        if self.key is None and self.operator != "Exists":
            raise ValueError("a toleration without a key must use operator Exists (it tolerates every taint); "
                             "give a key for operator Equal")
        return self


class Kueue(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    queue_name: LabelledName = Field(description="e.g. hyperpod-ns-<team>-localqueue")
    priority_class: LabelledName | None = Field(None, description="e.g. <name>-priority")


class Storage(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    root: StorageRoot = Field(description="where runs, checkpoints and the promotion registry live (path or s3://)")
    fsx_claim: DNSSubdomain | None = Field(None, description="FSx for Lustre PVC name, conventionally fsx-claim")
    fsx_mount_path: AbsolutePath = "/fsx"


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
    head_node_selector: dict[QualifiedName, LabelValue] = Field(default_factory=dict,
                                                                description="where the CPU head runs (empty: anywhere)")
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
    serving_image: ImageRef | None = Field(None, description="inference image named in the model package (pinned by digest)")
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
    namespace: DNSLabel | None = None
    service_account: DNSSubdomain | None = None
    node_selector: dict[QualifiedName, LabelValue] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    kueue: Kueue | None = None
    kfp_host: str | None = None
    rayjob: RayJobSizing | None = Field(None, description="the RayJob's shape (required with backend: rayjob)")
    eval_gpus: int = Field(0, ge=0, le=8, description="nvidia.com/gpu for the evaluate pods with backend rayjob (an 8B model "
                           "evaluates on a GPU, not on CPU)")
    eval_engine: Literal["hf", "vllm"] = Field(
        "hf", description="inference engine of the evaluate tasks: hf (transformers generate, in images.runtime) or vllm "
        "(batched, prefix-cached decoding on the evaluate pods' GPU, in images.trainer, which has vLLM); both evaluations "
        "of a run use it")
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
        if self.eval_engine == "vllm" and self.kind == "hyperpod":
            # the CUDA vLLM build lives in the trainer image, and it serves on a GPU only
            if self.images.trainer is None:
                raise ValueError("eval_engine vllm runs the evaluate tasks in images.trainer (the image with vLLM): give "
                                 "images.trainer, or use eval_engine: hf")
            if self.evaluation_gpus < 1:
                raise ValueError("eval_engine vllm needs a GPU in each evaluate pod: set eval_gpus >= 1 (backend rayjob) or "
                                 "task_gpus >= 1 (backend local), or use eval_engine: hf")
        sm = self.sagemaker
        if self.backend == "rayjob" and sm is not None and sm.cluster_name and INSTANCE_TYPE_LABEL not in self.node_selector:
            raise ValueError(f"sagemaker.cluster_name asks for a preflight of the HyperPod cluster's GPU nodes, but "
                             f"node_selector has no {INSTANCE_TYPE_LABEL} to say which instance type the RayJob needs: "
                             "add it (e.g. ml.p5.48xlarge), or remove cluster_name to launch without the check")
        if sm is not None and sm.model_package_group and sm.serving_image is None:
            raise ValueError("sagemaker.model_package_group needs sagemaker.serving_image (the model package's container)")
        return self

    @property
    def evaluation_gpus(self) -> int:
        """nvidia.com/gpu of each evaluate pod, as the DAG sets it: eval_gpus with backend rayjob (training is the
        RayJob's), task_gpus with backend local (the model runs in the task pods), none with backend ray."""
        return {"rayjob": self.eval_gpus, "local": self.task_gpus}.get(self.backend, 0)

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
            if image is not None and not is_pinned(image):
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
