"""The KubeRay `RayJob` that runs distributed GRPO on HyperPod, built from a profile.

A CPU head (the Ray driver: `python -m mazerl train grpo --backend ray`) and one GPU worker group
(FSDP2 ranks and vLLM engines, colocated one pair per GPU), with EFA, `/dev/shm` in memory, the FSx
claim, HyperPod's health-checked node selector, Kueue labels, a deadline and a TTL. The name is a
function of the KFP run and task, so a retried task finds the job its first attempt created.
"""

from __future__ import annotations

import hashlib
import re
import shlex

import yaml

from ..profiles import Profile

API_VERSION = "ray.io/v1"
KIND = "RayJob"
LABEL_RUN = "mazerl.io/kfp-run-id"
LABEL_TASK = "mazerl.io/task"
LABEL_PART_OF = "app.kubernetes.io/part-of"
# EFA and NCCL on p5/p4d (libfabric's EFA provider with GPUDirect RDMA); NCCL finds aws-ofi-nccl in the image
EFA_ENV = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "NCCL_DEBUG": "WARN", "NCCL_PROTO": "simple"}
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class RayJobSpecError(ValueError):
    """A profile or run that cannot become a valid RayJob; the message names the field."""


def job_name(run_id: str, task: str = "train-grpo") -> str:
    """`mazerl-<task>-<10 hex>`: deterministic per KFP run and task, a valid DNS label, short enough
    for the RayCluster and pod names KubeRay derives from it."""
    digest = hashlib.sha256(f"{run_id}/{task}".encode()).hexdigest()[:10]
    return f"mazerl-{re.sub(r'[^a-z0-9-]', '-', task.lower())[:20].strip('-')}-{digest}"


def _label_value(value: str, what: str) -> str:
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        raise RayJobSpecError(f"{what} {value!r} cannot be a Kubernetes label value (<= 63 characters: letters, digits, "
                              "'-', '_', '.', starting and ending with a letter or digit)")
    return value


def entrypoint(config: str, overrides: dict[str, object]) -> str:
    """The driver's command: the training config (a path the pods can read) plus the profile's sizing."""
    # a retried job resumes from the run's last checkpoint; one that died before its first checkpoint
    # starts over in the run directory (--overwrite clears that attempt's metrics, never an input)
    args = ["python", "-m", "mazerl", "train", "grpo", "--config", config, "--backend", "ray", "--resume", "auto", "--overwrite"]
    for key, value in sorted(overrides.items()):
        args += ["--set", f"{key}={value}"]
    return shlex.join(args)


def sizing_overrides(profile: Profile) -> dict[str, object]:
    """The training config's distributed settings the profile's RayJob shape implies: one rank and one
    colocated vLLM engine per GPU."""
    r = profile.rayjob
    ranks = r.workers * r.gpus_per_worker
    return {"distributed.backend": "ray", "distributed.ranks": ranks, "distributed.rollout_workers": ranks,
            "distributed.placement": "colocated", "distributed.gpus_per_rank": 1,
            "distributed.cpus_per_actor": max(1, r.cpus_per_worker // (2 * r.gpus_per_worker)),
            "policy.engine": "vllm", "policy.device": "cuda"}


def build_rayjob(profile: Profile, config: str, run_id: str, task: str = "train-grpo",
                 extra_overrides: dict[str, object] | None = None) -> dict:
    """The RayJob manifest (a plain dict, ready for the Kubernetes API or `kubectl apply`)."""
    if profile.kind != "hyperpod" or profile.rayjob is None:
        raise RayJobSpecError(f"profile {profile.name!r} has no rayjob section: a RayJob needs a hyperpod profile with "
                              "rayjob sizing (workers, gpus_per_worker, ...)")
    if profile.images.trainer is None:
        raise RayJobSpecError(f"profile {profile.name!r}: images.trainer (the GPU image of the RayJob) is not set")
    r = profile.rayjob
    name = job_name(run_id, task)
    labels = {LABEL_PART_OF: "mazerl", LABEL_RUN: _label_value(run_id, "KFP run id"), LABEL_TASK: _label_value(task, "task")}
    if profile.kueue is not None:
        labels["kueue.x-k8s.io/queue-name"] = profile.kueue.queue_name
        if profile.kueue.priority_class:
            labels["kueue.x-k8s.io/priority-class"] = profile.kueue.priority_class
    fsx = profile.storage
    volumes = [{"name": "fsx", "persistentVolumeClaim": {"claimName": fsx.fsx_claim}}]
    mounts = [{"name": "fsx", "mountPath": fsx.fsx_mount_path}]
    tolerations = [t.model_dump(exclude_none=True) for t in profile.tolerations]
    pod_labels = {LABEL_PART_OF: "mazerl", LABEL_RUN: run_id}
    env = [{"name": "MAZERL_RUN_ID", "value": run_id}, {"name": "RAY_AUTH_MODE", "value": "disabled"}]

    head = {
        "rayStartParams": {"dashboard-host": "0.0.0.0", "num-gpus": "0", "metrics-export-port": str(r.metrics_port)},
        "template": {
            "metadata": {"labels": pod_labels},
            "spec": {
                "serviceAccountName": profile.service_account,
                "containers": [{
                    "name": "ray-head",
                    "image": profile.images.trainer,
                    "resources": {"requests": {"cpu": str(r.head_cpu), "memory": r.head_memory},
                                  "limits": {"cpu": str(r.head_cpu), "memory": r.head_memory}},
                    "ports": [{"containerPort": 6379, "name": "gcs"}, {"containerPort": 8265, "name": "dashboard"},
                              {"containerPort": 10001, "name": "client"}, {"containerPort": r.metrics_port, "name": "metrics"}],
                    "env": env,
                    "volumeMounts": mounts,
                }],
                "volumes": volumes,
                **({"nodeSelector": dict(r.head_node_selector)} if r.head_node_selector else {}),
                **({"tolerations": tolerations} if tolerations else {}),
            },
        },
    }
    worker_limits = {"cpu": str(r.cpus_per_worker), "memory": r.memory_per_worker, "nvidia.com/gpu": str(r.gpus_per_worker)}
    if r.efa_per_worker:
        worker_limits["vpc.amazonaws.com/efa"] = str(r.efa_per_worker)
    worker = {
        "groupName": "gpu",
        "replicas": r.workers,
        "minReplicas": r.workers,
        "maxReplicas": r.workers,
        "rayStartParams": {"metrics-export-port": str(r.metrics_port)},
        "template": {
            "metadata": {"labels": pod_labels},
            "spec": {
                "serviceAccountName": profile.service_account,
                "containers": [{
                    "name": "ray-worker",
                    "image": profile.images.trainer,
                    "resources": {"requests": dict(worker_limits), "limits": dict(worker_limits)},
                    "ports": [{"containerPort": r.metrics_port, "name": "metrics"}],
                    "env": env + ([{"name": k, "value": v} for k, v in EFA_ENV.items()] if r.efa_per_worker else []),
                    "volumeMounts": mounts + [{"name": "dshm", "mountPath": "/dev/shm"}],
                }],
                # NCCL and Ray's object store use shared memory; the default 64 MiB /dev/shm is far too small
                "volumes": volumes + [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": r.shm_size}}],
                "nodeSelector": dict(profile.node_selector),
                **({"tolerations": tolerations} if tolerations else {}),
            },
        },
    }
    overrides = {**sizing_overrides(profile), **(extra_overrides or {})}
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": profile.namespace, "labels": labels},
        "spec": {
            "entrypoint": entrypoint(config, overrides),
            "submissionMode": "K8sJobMode",
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": r.ttl_seconds_after_finished,
            "activeDeadlineSeconds": r.active_deadline_seconds,
            "backoffLimit": r.backoff_limit,
            "rayClusterSpec": {"rayVersion": r.ray_version, "headGroupSpec": head, "workerGroupSpecs": [worker]},
        },
    }


class _NoAliases(yaml.SafeDumper):
    def ignore_aliases(self, data) -> bool:  # plain YAML for reviewers and kubectl: no &anchors
        return True


def render(manifest: dict) -> str:
    return yaml.dump(manifest, Dumper=_NoAliases, sort_keys=False, default_flow_style=False)
