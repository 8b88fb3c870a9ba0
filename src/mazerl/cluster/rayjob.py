"""The KubeRay `RayJob` that runs distributed GRPO on HyperPod, built from a profile.

A CPU head (the Ray driver: `python -m mazerl train grpo --backend ray`) and one GPU worker group
(FSDP2 ranks and vLLM engines, colocated one pair per GPU), with EFA, `/dev/shm` in memory, the FSx
claim, HyperPod's health-checked node selector, Kueue labels, a deadline and a TTL. The name is a
function of the KFP run and task, so a retried task finds the job its first attempt created.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shlex
import unicodedata
from collections.abc import Mapping
from pathlib import Path

import yaml

from ..config import ConfigError, resolve_job_config
from ..errors import UserError
from ..profiles import Profile, check_label_value
from .plan import check_plan, sizing_overrides

API_VERSION = "ray.io/v1"
KIND = "RayJob"
LABEL_RUN = "mazerl.io/kfp-run-id"
LABEL_TASK = "mazerl.io/task"
LABEL_PART_OF = "app.kubernetes.io/part-of"
# EFA and NCCL on p5/p4d (libfabric's EFA provider with GPUDirect RDMA); NCCL finds aws-ofi-nccl in the image
EFA_ENV = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "NCCL_DEBUG": "WARN", "NCCL_PROTO": "simple"}


class RayJobSpecError(UserError, ValueError):
    """A profile, run or job config that cannot become a valid RayJob; the message names the field."""


def job_name(run_id: str, task: str = "train-grpo") -> str:
    """`mazerl-<task>-<10 hex>`: deterministic per KFP run and task, a valid DNS label, short enough
    for the RayCluster and pod names KubeRay derives from it."""
    digest = hashlib.sha256(f"{run_id}/{task}".encode()).hexdigest()[:10]
    return f"mazerl-{re.sub(r'[^a-z0-9-]', '-', task.lower())[:20].strip('-')}-{digest}"


def _label_value(value: str, what: str) -> str:
    try:
        return check_label_value(value)
    except ValueError as err:
        raise RayJobSpecError(f"{what}: {err}") from None


def check_run_id(run_id: str) -> str:
    """A KFP run id names the run's RayJobs by label (and selects them for cleanup): a non-empty label value,
    so it can neither break the manifest nor widen a label selector."""
    if not run_id:
        raise RayJobSpecError("KFP run id is empty: it must be a non-empty Kubernetes label value")
    return _label_value(run_id, "KFP run id")


def _on_one_line(text: str) -> bool:
    return not any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in text)


def render_override(key: str, value: object) -> str:
    """`key=value` for the driver's `--set`. Text goes as given: the pod reads it by the setting's type,
    as load_config reads it here. Anything else goes in YAML flow syntax (None is `null`, 1e-06 is
    `1.0e-06`, a list `[a, b]`), JSON where YAML would need more than one line. build_rayjob checks that
    the pod reads back the config meant here."""
    if not key or "=" in key or not _on_one_line(key) or any(c.isspace() for c in key):
        raise RayJobSpecError(f"override key {key!r} cannot be passed to the RayJob's driver as --set KEY=VALUE: a "
                              "dotted setting name without '=', spaces or control characters")
    if isinstance(value, str):
        candidates = [value]
    else:
        candidates = []
        try:
            dumped = yaml.safe_dump(value, default_flow_style=True, width=math.inf, allow_unicode=True)
            candidates.append(dumped.removesuffix("\n").removesuffix("\n..."))
        except yaml.YAMLError:  # a type safe_dump does not know (a tuple): JSON below
            pass
        candidates.append(json.dumps(value, default=str))
    for text in candidates:
        if _on_one_line(text):
            return f"{key}={text}"
    raise RayJobSpecError(f"override {key}={value!r}: the value holds a line break or control character, which the "
                          "RayJob's command line cannot carry")


def entrypoint(config: str, overrides: dict[str, object]) -> str:
    """The driver's command: the training config (a path the pods can read) plus the profile's sizing."""
    # a retried job resumes from the run's last checkpoint; one that died before its first checkpoint
    # starts over in the run directory (--overwrite clears that attempt's metrics, never an input)
    args = ["python", "-m", "mazerl", "train", "grpo", "--config", config, "--backend", "ray", "--resume", "auto", "--overwrite"]
    for key, value in sorted(overrides.items()):
        args += ["--set", render_override(key, value)]
    return shlex.join(args)


def driver_job_config(command: str):
    """The GRPOConfig the driver pod will run: `command` (an entrypoint) read back the way its shell and
    `mazerl train grpo` read it (cli/train.py, train_grpo_cmd: --set overrides, then --backend), validated by the
    same model. A ConfigError names the setting the pod would refuse."""
    from ..config import load_config, parse_overrides
    from ..rl.config import GRPOConfig

    args = shlex.split(command)
    sets = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == "--set"]
    overrides = parse_overrides(sets)
    overrides["distributed.backend"] = args[args.index("--backend") + 1]
    return load_config(GRPOConfig, args[args.index("--config") + 1], overrides)


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def check_job_config(config: str, overrides: dict[str, object], command: str):
    """The job config `config` with `overrides` means here, validated (a ConfigError names what the pod
    would refuse), and the same config the driver will read from `command`; returns it."""
    from ..config import load_config
    from ..rl.config import GRPOConfig

    meant = load_config(GRPOConfig, config, {**overrides, "distributed.backend": "ray"})
    read = driver_job_config(command)
    if read != meant:
        here, there = _flat(meant.model_dump(mode="json")), _flat(read.model_dump(mode="json"))
        differ = "; ".join(f"{k}: {here.get(k)!r} given, {there.get(k)!r} in the pod"
                           for k in sorted(set(here) | set(there)) if here.get(k) != there.get(k))
        raise RayJobSpecError(f"the RayJob's driver would read these overrides differently from what was given ({differ}): "
                              "pass them as text (--set KEY=VALUE)")
    return meant


def placement_bundles(d) -> list[dict]:
    """The Ray resource bundles the Ray backend asks a placement group for (RayGRPO._bundles, which a test
    keeps equal to this): one per rank (colocated: shared with its rollout actor) and, split, one per
    rollout actor."""
    gpu = {"GPU": d.gpus_per_rank} if d.gpus_per_rank else {}
    if d.placement == "colocated":
        return [{"CPU": 2 * d.cpus_per_actor, **gpu}] * d.ranks
    rollout_gpu = {"GPU": d.gpus_per_rollout_worker} if d.gpus_per_rollout_worker else {}
    return [{"CPU": d.cpus_per_actor, **gpu}] * d.ranks + [{"CPU": d.cpus_per_actor, **rollout_gpu}] * d.rollout_workers


def check_placement(profile: Profile, cfg) -> None:
    """Refuse a job config whose Ray actors cannot all be placed on the RayJob's nodes (a CPU head and
    `workers` GPU workers): Ray would wait for resources that never come. Only what is certain is refused:
    a bundle no node can hold, more of one kind of bundle than the nodes hold, more GPUs or CPUs in all."""
    r = profile.rayjob
    bundles = placement_bundles(cfg.distributed)
    nodes = f"{r.workers} worker(s) x {r.gpus_per_worker} GPUs and {r.cpus_per_worker} CPUs, and a head of {r.head_cpu} CPUs"
    hint = ("lower distributed.ranks / rollout_workers / gpus_per_rank / gpus_per_rollout_worker / cpus_per_actor, or "
            "raise the profile's rayjob.workers / gpus_per_worker / cpus_per_worker")
    gpus_needed = sum(b.get("GPU", 0) for b in bundles)
    cpus_needed = sum(b["CPU"] for b in bundles)
    d = cfg.distributed
    if gpus_needed > r.workers * r.gpus_per_worker + 1e-9:
        asked = f"{d.ranks} ranks x {d.gpus_per_rank:g}"
        if d.placement == "split":
            asked += f" + {d.rollout_workers} rollout workers x {d.gpus_per_rollout_worker:g}"
        raise RayJobSpecError(f"the job config asks Ray for {gpus_needed:g} GPUs ({asked}); the RayJob has "
                              f"{r.workers * r.gpus_per_worker} ({nodes}): {hint}")
    if cpus_needed > r.workers * r.cpus_per_worker + r.head_cpu + 1e-9:
        raise RayJobSpecError(f"the job config asks Ray for {cpus_needed:g} CPUs; the RayJob has "
                              f"{r.workers * r.cpus_per_worker + r.head_cpu} ({nodes}): {hint}")
    for bundle in {json.dumps(b, sort_keys=True): b for b in bundles}.values():
        gpu, cpu = bundle.get("GPU", 0), bundle["CPU"]
        # a bundle with GPUs goes to a worker; a CPU-only bundle may also go to the head
        fits_head = not gpu and cpu <= r.head_cpu
        if gpu > r.gpus_per_worker or (cpu > r.cpus_per_worker and not fits_head):
            raise RayJobSpecError(f"one Ray bundle of the job needs {gpu:g} GPU and {cpu:g} CPU on one node; no node of "
                                  f"the RayJob has that ({nodes}; gpus_per_worker, cpus_per_worker): {hint}")
        per_worker = math.floor(min(r.gpus_per_worker / gpu if gpu else math.inf, r.cpus_per_worker / cpu) + 1e-9)
        per_head = math.floor(r.head_cpu / cpu + 1e-9) if not gpu else 0
        count = sum(1 for b in bundles if b == bundle)
        if count > per_worker * r.workers + per_head:
            raise RayJobSpecError(f"the job needs {count} Ray bundles of {gpu:g} GPU and {cpu:g} CPU; the RayJob's nodes "
                                  f"hold at most {per_worker * r.workers + per_head} ({nodes}): {hint}")


# The train task's pod, from the downward API (pipeline/dag.py sets these on it): the RayJob's owner
POD_ENV_FIELDS = {"MAZERL_POD_NAME": "metadata.name", "MAZERL_POD_UID": "metadata.uid",
                  "MAZERL_POD_NAMESPACE": "metadata.namespace"}


def launcher_pod_owner(env: Mapping[str, str], namespace: str) -> tuple[dict | None, str]:
    """The owner reference that makes Kubernetes delete the RayJob (and so its Ray cluster) when the pod
    launching it is deleted, and a line saying what was decided. None outside a pod (a local run: the
    variables are absent), and for a pod in another namespace than the job's: Kubernetes treats a
    cross-namespace owner as absent and would delete the job at once."""
    name, uid, pod_namespace = (env.get(k) or "" for k in POD_ENV_FIELDS)
    if not (name and uid and pod_namespace):
        return None, ("no owner reference on the RayJob: not in a pod with the downward API variables "
                      f"({', '.join(POD_ENV_FIELDS)})")
    if pod_namespace != namespace:
        return None, (f"no owner reference on the RayJob: this pod is in namespace {pod_namespace!r}, the job in "
                      f"{namespace!r} (an owner must share the namespace)")
    # not a controller (Kueue takes a job whose controller is a kind it manages, a Pod with its pod
    # integration, for part of that workload), and not blocking the pod's deletion (that would need
    # rights on pods/finalizers, which the Role does not grant)
    owner = {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid, "controller": False, "blockOwnerDeletion": False}
    return owner, f"RayJob owned by pod {pod_namespace}/{name}: deleted with it"


def build_rayjob(profile: Profile, config: str, run_id: str, task: str = "train-grpo",
                 extra_overrides: dict[str, object] | None = None, owner: dict | None = None) -> dict:
    """The RayJob manifest (a plain dict, ready for the Kubernetes API or `kubectl apply`); `owner`: an
    owner reference (launcher_pod_owner) for its metadata."""
    if profile.kind != "hyperpod" or profile.rayjob is None:
        raise RayJobSpecError(f"profile {profile.name!r} has no rayjob section: a RayJob needs a hyperpod profile with "
                              "rayjob sizing (workers, gpus_per_worker, ...)")
    if profile.images.trainer is None:
        raise RayJobSpecError(f"profile {profile.name!r}: images.trainer (the GPU image of the RayJob) is not set")
    profile.check_pinned()
    r = profile.rayjob
    name = job_name(run_id, task)
    labels = {LABEL_PART_OF: "mazerl", LABEL_RUN: check_run_id(run_id), LABEL_TASK: _label_value(task, "task")}
    # the driver's command and the job config it will run, checked before anything is rendered or created
    overrides = {**sizing_overrides(profile), **(extra_overrides or {})}
    command = entrypoint(config, overrides)
    try:
        readable = Path(resolve_job_config(config)).is_file()
    except ConfigError as err:
        raise RayJobSpecError(str(err)) from None
    if not readable:
        raise RayJobSpecError(f"job config {config} not found here, so the config the RayJob's driver will run cannot be "
                              "checked before the job is rendered: give a shipped config name, or render where that path "
                              "is mounted (on a pod with the FSx claim)")
    try:
        job = check_job_config(config, overrides, command)
    except ConfigError as err:
        raise RayJobSpecError(f"the RayJob's driver would refuse its job config (--config {config} with the profile's "
                              f"sizing and the overrides); nothing was rendered: {err}") from None
    check_placement(profile, job)
    check_plan(profile, job)  # per-GPU memory and vLLM's per-prompt limits (a PlanError names what does not fit)
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
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": profile.namespace, "labels": labels,
                     **({"ownerReferences": [owner]} if owner else {})},
        "spec": {
            "entrypoint": command,
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
