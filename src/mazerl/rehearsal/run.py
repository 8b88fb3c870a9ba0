"""`mazerl pipeline rehearse`: the compiled cluster DAG of a HyperPod profile, run on this machine.

    kfp.local runs every task of the profile's DAG as a subprocess of this Python (the trainer image's
    part: it must hold vLLM, kfp and moto)
      train step (the launcher, as shipped) --kubeconfig--> local Kubernetes API (kube_api; RayJobs checked
                                                            against KubeRay's CRD)
                                                              └ local KubeRay (kuberay): the entrypoint on a
                                                                local Ray: FSDP2 ranks + colocated vLLM engines
      S3 and SageMaker (storage root, checkpoints, HyperPod preflight, Model Registry): moto's server
      FSx: a folder under --out

Only the model, the device and dtypes, and counts change; `substitutions` lists each one, and the job config
the entrypoint ran is compared key by key with the one the shipped profile would run: any other
difference stops the rehearsal. `rehearsal.json` records what ran and how it ended.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..atomic import write_json, write_text
from ..errors import UserError
from ..profiles import Profile

# what the local KubeRay appends to the entrypoint (setting, value, why); everything else runs as shipped
RAYJOB_SUBSTITUTIONS = [
    ("distributed.ranks", 2, "2 CPU cores: two FSDP2 ranks (gloo) stand for the node's GPUs"),
    ("distributed.rollout_workers", 2, "one colocated vLLM engine beside each rank, as shipped"),
    ("distributed.gpus_per_rank", 0, "no GPU: Ray places the ranks on CPU"),
    ("distributed.cpus_per_actor", 0.5, "each rank and its engine share one of the 2 cores"),
    ("policy.device", "cpu", "no GPU"),
    ("policy.dtype", "float32", "the CPU run computes in float32"),
    ("mazes_per_step", 2, "count"),
    ("group_size", 2, "count"),
    ("mini_batch_mazes", 1, "count: two optimizer steps a step, as shipped (32 mazes in mini-batches of 16)"),
    ("eval_mazes", 2, "count: the periodic greedy evaluation"),
    ("filter_zero_variance_groups", False,
     "a random mover never stops on the goal: every group would be dropped for want of signal and the update would "
     "never run; kept, every sample goes through FSDP2's forward, backward and optimizer step (advantage 0)"),
]
# pipeline parameters the rehearsal passes (parameter, value, why)
PIPELINE_SUBSTITUTIONS = [
    ("dataset_preset", "smoke", "count: the smoke splits (128 heldout mazes, 256 train)"),
    ("heldout_mazes", 4, "count: evaluation mazes"),
    ("other_mazes", 2, "count: evaluation mazes"),
    ("reference_mazes", 2, "count: evaluation mazes"),
    ("grpo_steps", 2, "count: training steps"),
    ("min_gain", -1.0, "4 evaluation mazes cannot show a gain: the gate is opened so promotion and registration run"),
    ("max_p_value", 1.0, "4 evaluation mazes cannot reach p <= 0.05: the gate is opened so promotion and registration run"),
]
# the job config keys the rehearsal may change (RAYJOB_SUBSTITUTIONS, the model, and grpo_steps' steps)
ALLOWED_JOB_KEYS = {k for k, _, _ in RAYJOB_SUBSTITUTIONS} | {"policy.model", "steps"}
POD = {"MAZERL_POD_NAME": "rehearsal-train-grpo", "MAZERL_POD_UID": "00000000-0000-4000-8000-00000000000a"}


class RehearsalError(UserError):
    """The rehearsal cannot run here, or it ran something other than what ships."""


@dataclass
class Rehearsal:
    profile: Profile  # as shipped
    out: Path
    cancel_after_step: int | None = None
    log: list[str] = field(default_factory=list)


def _require_runtime() -> None:
    import importlib.util

    missing = [m for m in ("vllm", "ray", "kfp", "moto", "kubernetes", "boto3", "jsonschema")
               if importlib.util.find_spec(m) is None]
    if missing:
        raise RehearsalError(
            f"the rehearsal runs the trainer image's part here and needs {', '.join(missing)} in this Python "
            "(the vLLM CPU build's venv has them all: `make vllm-env`, then `.venv-vllm/bin/mazerl pipeline rehearse ...`)")


def rehearsed_profile(profile: Profile, fsx: Path) -> Profile:
    """The shipped profile with FSx mounted at a local folder: the one profile substitution."""
    return profile.model_copy(update={"storage": profile.storage.model_copy(update={"fsx_mount_path": str(fsx)})})


def config_differences(shipped: dict, rehearsed: dict, fsx: Path, shipped_fsx: str) -> dict[str, tuple]:
    """key -> (shipped, rehearsed) for every job config value that differs once FSx paths are compared
    relative to their mount."""
    from ..cluster.rayjob import _flat

    def norm(value):
        if isinstance(value, str) and value.startswith(str(fsx)):
            return shipped_fsx.rstrip("/") + value[len(str(fsx)):]
        return value

    a, b = _flat(shipped), {k: norm(v) for k, v in _flat(rehearsed).items()}
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def shipped_job_config(profile: Profile, staged: dict, fsx: Path):
    """The job config the shipped profile's train step would hand its RayJob for the same run: the same
    staged paths on the real FSx mount, the profile's model."""
    from ..cluster.plan import job_config_for_profile

    mount = profile.storage.fsx_mount_path.rstrip("/")
    paths = {k: mount + staged[k][len(str(fsx)):] for k in ("train_data", "eval_data", "output_dir")}
    overrides = {**paths, "checkpoint_uri": staged.get("checkpoint_uri")}
    return job_config_for_profile(profile, None, overrides)


class _Terminator:
    """Plays KFP terminating the run: once training has written step N, SIGTERM to the train task's Python
    (what its pod's deletion sends), then to every task that starts after it (a terminated run runs no more
    tasks: no retry, and, as on KFP, no exit handler either)."""

    def __init__(self, fsx: Path, step: int, log):
        self.fsx, self.step, self.log = fsx, step, log
        self.terminated_pid: int | None = None
        self.stopped_later: list[str] = []  # tasks stopped after the train task (retries, the exit handler)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _reached(self) -> bool:
        for metrics in self.fsx.glob("mazerl/runs/*/grpo/metrics.jsonl"):
            lines = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
            if any(r.get("step", 0) >= self.step for r in lines):
                return True
        return False

    @staticmethod
    def _tasks() -> list[tuple[object, str]]:
        """(process, component function) of every kfp.local task's Python running under this process."""
        import psutil

        found = []
        for proc in psutil.Process().children(recursive=True):
            try:
                cmd = proc.cmdline()
            except psutil.Error:
                continue
            if "kfp.dsl.executor_main" in cmd and "--function_to_execute" in cmd and not Path(cmd[0]).name.endswith("sh"):
                found.append((proc, cmd[cmd.index("--function_to_execute") + 1]))
        return found

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            if self._reached():
                break
        else:
            return
        for proc, name in self._tasks():
            if name == "train_grpo":
                self.log(f"terminating the run after step {self.step}: SIGTERM to the train task (pid {proc.pid})")
                self.terminated_pid = proc.pid
                proc.send_signal(signal.SIGTERM)
        seen = {self.terminated_pid}
        while not self._stop.wait(0.1):
            for proc, name in self._tasks():
                if proc.pid not in seen:
                    seen.add(proc.pid)
                    self.stopped_later.append(name)
                    proc.send_signal(signal.SIGTERM)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)


def rehearse(profile: Profile, out: Path, cancel_after_step: int | None = None, log=print) -> dict:
    """Run the rehearsal; returns what rehearsal.json holds (also written to `out`)."""
    from ..cluster.plan import build_plan, job_config_for_profile
    from ..cluster.rayjob import driver_job_config
    from ..pipelines.run import run_local_logged
    from .aws import environment, local_aws, registered_models
    from .kube_api import ClusterState, K8sAPIServer, rayjob_schema_errors, write_kubeconfig
    from .kuberay import LocalKubeRay
    from .model import build_rehearsal_model

    if profile.kind != "hyperpod" or profile.backend != "rayjob" or profile.rayjob is None:
        raise RehearsalError(f"profile {profile.name!r} is not a cluster profile with a RayJob (kind hyperpod, backend "
                             "rayjob): the rehearsal plays a HyperPod run; run a local profile with `mazerl pipeline run`")
    if cancel_after_step is not None and cancel_after_step < 1:
        raise RehearsalError(f"--cancel-after-step {cancel_after_step}: give a training step >= 1")
    out = Path(out).resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise RehearsalError(f"--out {out} is not an empty folder: give a new one (a rehearsal never writes over other files)")
    _require_runtime()
    out.mkdir(parents=True, exist_ok=True)
    fsx = out / "fsx"
    fsx.mkdir()
    # the plan at true scale: the shipped profile and job config, from the real architecture
    shipped_cfg = job_config_for_profile(profile)
    plan = build_plan(profile, shipped_cfg).to_json()
    real_name = Path(profile.pipeline.model).name
    log(f"building the rehearsal model: a tiny Qwen3-VL with {real_name}'s proportions")
    model_dir = build_rehearsal_model(real_name, out / "model")
    local_profile = rehearsed_profile(profile, fsx)

    kuberay = LocalKubeRay({k: v for k, v, _ in RAYJOB_SUBSTITUTIONS}, out)
    state = ClusterState(executor=kuberay, on_delete=kuberay.on_delete, validate=True)
    arguments = {"model": str(model_dir), **{k: v for k, v, _ in PIPELINE_SUBSTITUTIONS}}
    import warnings

    # the shipped images are not plain Python images: kfp.local says so for every task
    warnings.filterwarnings("ignore", message=".*custom or non-Python base image.*")
    with local_aws(profile), K8sAPIServer(state) as api:
        kubeconfig = out / "kubeconfig"
        write_kubeconfig(kubeconfig, api.url, "rehearsal", profile.namespace, name="rehearsal")
        # what a cluster gives the train task's pod: API credentials and the downward API's name and uid
        pod_env = {"KUBECONFIG": str(kubeconfig), "MAZERL_POD_NAMESPACE": profile.namespace or "", **POD}
        with environment(pod_env):
            log(f"running the {profile.name} DAG with kfp.local (logs under {out / 'kfp'})")
            if cancel_after_step is not None:
                with _Terminator(fsx, cancel_after_step, log) as terminator:
                    run = run_local_logged(local_profile, out / "kfp", arguments)
                terminated = terminator.terminated_pid is not None
                stopped_later = terminator.stopped_later
            else:
                run = run_local_logged(local_profile, out / "kfp", arguments)
                terminated, stopped_later = False, []
            # Kubernetes' garbage collector: RayJobs owned by the (now deleted) train pod go with it
            collected = [key for key, job in list(state.jobs.items())
                         if any(o.get("uid") == POD["MAZERL_POD_UID"] for o in job["metadata"].get("ownerReferences", []))
                         and terminated]
            for key in collected:
                kuberay.on_delete(state.jobs.pop(key))
            time.sleep(1.0)
            created = [job for _, job in sorted(state.jobs.items())]
            manifests = state.created  # as the launcher sent them
            registered = (registered_models(profile.sagemaker.model_package_group)
                          if profile.sagemaker and profile.sagemaker.model_package_group else [])

    if not kuberay.commands:
        raise RehearsalError(f"the DAG created no RayJob; see {run.log}" + (f" ({str(run.error).splitlines()[0]})" if run.error else ""))
    manifest_path = out / "rayjob.yaml"
    write_text(manifest_path, yaml.safe_dump(manifests[0], sort_keys=False))
    schema_problems = rayjob_schema_errors(manifests[0])
    # what the entrypoint ran, read back as `mazerl train grpo` reads its command line
    import shlex

    ran = driver_job_config(shlex.join(["python", *kuberay.commands[0][1:]]))
    staged = ran.model_dump(mode="json")
    shipped_for_run = shipped_job_config(profile, staged, fsx).model_dump(mode="json")
    differences = config_differences(shipped_for_run, staged, fsx, profile.storage.fsx_mount_path)
    unexpected = {k: v for k, v in differences.items() if k not in ALLOWED_JOB_KEYS}
    substitutions = _substitution_list(profile, differences)
    metrics = _training_metrics(fsx)
    comparison = _comparison(run.run_dir)
    outcome = {
        "compared": comparison is not None,
        "decision": (comparison or {}).get("decision", {}).get("improved"),
        "registered": bool(registered),
        "model_packages": [m.get("ModelPackageArn") for m in registered],
        "rayjobs_left": sum(1 for job in created if (job.get("status") or {}).get("jobDeploymentStatus")
                            not in ("Complete", "Failed", "ValidationFailed")),
        "rayjobs_collected_with_the_pod": len(collected),
        "processes_left": kuberay.running(),
        "terminated_after_step": cancel_after_step if terminated else None,
        "tasks_stopped_after_termination": stopped_later,
        "pipeline_error": _plain(str(run.error).splitlines()[0]) if run.error else None,
        "steps_trained": max((r.get("step", 0) for r in metrics), default=0),
    }
    record = {
        "profile": profile.name,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "substitutions": substitutions,
        "unexpected_differences": {k: list(v) for k, v in unexpected.items()},
        "engine": ran.policy.engine,
        "placement": {"placement": ran.distributed.placement, "ranks": ran.distributed.ranks,
                      "rollout_workers": ran.distributed.rollout_workers, "backend": ran.distributed.backend},
        "history": ran.policy.history.model_dump(mode="json"),
        "weight_sync": _weight_sync(ran, metrics),
        # the FSDP2 update as it ran: a random mover earns no reward, so its gradients are zero (the path runs;
        # learning itself is what the local DAG shows)
        "update": {k: [r.get(k) for r in metrics if "optimizer_steps" in r]
                   for k in ("optimizer_steps", "update/rank0_samples", "update/rank1_samples", "loss_tokens", "grad_norm")},
        "rayjob_manifest": str(manifest_path),
        "rayjob_schema_errors": schema_problems,
        "entrypoint": kuberay.commands[0][1:],
        "plan": plan,
        "outcome": outcome,
        "logs": {"pipeline": str(run.log), "entrypoint": [str(p) for p in sorted(out.glob("*.entrypoint.log"))]},
    }
    write_json(out / "rehearsal.json", record)
    if unexpected:
        raise RehearsalError("the rehearsal ran settings that differ from what ships beyond its substitutions: "
                             + "; ".join(f"{k}: shipped {a!r}, ran {b!r}" for k, (a, b) in unexpected.items())
                             + f" (rehearsal.json: {out / 'rehearsal.json'})")
    return record


def _plain(text: str) -> str:
    """kfp.local's message without its terminal colours."""
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _substitution_list(profile: Profile, differences: dict) -> list[dict]:
    subs = [{"setting": "storage.fsx_mount_path", "shipped": profile.storage.fsx_mount_path, "rehearsed": "<out>/fsx",
             "why": "FSx for Lustre is a local folder"},
            {"setting": "pipeline.model", "shipped": profile.pipeline.model, "rehearsed": "<out>/model",
             "why": "a tiny Qwen3-VL with the real model's proportions (no hub, no GPU)"},
            {"setting": "evaluate.device", "shipped": "cuda (bfloat16)", "rehearsed": "cpu (float32)", "why": "no GPU"}]
    defaults = profile.pipeline.model_dump()
    shipped_params = {"dataset_preset": defaults["dataset_preset"], "heldout_mazes": defaults["eval_heldout_mazes"],
                      "other_mazes": defaults["eval_other_mazes"], "reference_mazes": 0, "grpo_steps": 0,
                      "min_gain": defaults["min_gain"], "max_p_value": defaults["max_p_value"]}
    for key, value, why in PIPELINE_SUBSTITUTIONS:
        subs.append({"setting": f"pipeline.{key}", "shipped": shipped_params[key], "rehearsed": value, "why": why})
    reasons = {k: why for k, _, why in RAYJOB_SUBSTITUTIONS} | {"policy.model": "the rehearsal model", "steps": "count"}
    for key, (shipped, rehearsed) in differences.items():
        subs.append({"setting": f"job.{key}", "shipped": shipped, "rehearsed": rehearsed, "why": reasons.get(key, "NOT A SUBSTITUTION")})
    return subs


def _training_metrics(fsx: Path) -> list[dict]:
    files = sorted(fsx.glob("mazerl/runs/*/grpo/metrics.jsonl"))
    return [json.loads(line) for line in files[0].read_text().splitlines() if line.strip()] if files else []


def _comparison(run_dir: Path | None) -> dict | None:
    if run_dir is None:
        return None
    found = sorted(run_dir.glob("compare/result/comparison.json"))
    return json.loads(found[0].read_text()) if found else None


def _weight_sync(cfg, metrics: list[dict]) -> dict:
    """How the weights reached the engines, as the run's metrics recorded it (each training step's)."""
    metrics = [r for r in metrics if "time/weight_sync" in r]
    keys = [k for k in sorted({k for r in metrics for k in r}) if k.startswith("weight_sync/") or k == "time/weight_sync"]
    modes = sorted({str(r["weight_sync/mode"]) for r in metrics if "weight_sync/mode" in r})
    return {"setting": cfg.distributed.weight_sync, "mode": ", ".join(modes) or None,
            "bucket_mb": cfg.distributed.weight_sync_bucket_mb,
            **{k: [r.get(k) for r in metrics] for k in keys if k != "weight_sync/mode"}}
