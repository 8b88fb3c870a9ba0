"""The RayJob launcher over a job's whole life: every KubeRay deployment status, the deadline counted
from status.startTime (not from time queued in Kueue), the owner reference to the launching pod, and
SIGTERM (a KFP run terminated from its UI) deleting the job. Through the real kubernetes client against
the local API server (mazerl.rehearsal.kube_api, 127.0.0.1 only)."""

from __future__ import annotations

import copy
import datetime as dt
import functools
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
import yaml

from mazerl.cluster.launcher import LauncherError, RayJobLauncher, custom_objects_api
from mazerl.cluster.rayjob import LABEL_RUN, build_rayjob, job_name, launcher_pod_owner
from mazerl.cluster.train_step import DEADLINE_MARGIN_S
from mazerl.profiles import load_profile

from mazerl.rehearsal.kube_api import ClusterState, K8sAPIServer, write_kubeconfig

NS = "hyperpod-ns-ml-research"
RUN = "3f2c1b9e-1111-2222-3333-444455556666"
HOUR = 3600.0
# the train step's deadline for the shipped profile: KubeRay's activeDeadlineSeconds and a margin
DEADLINE_S = load_profile("hyperpod-p5").rayjob.active_deadline_seconds + DEADLINE_MARGIN_S


class FakeTime:
    """The launcher's clocks, moved on by its own sleeps (with a real pause of a few ms, so the server's
    thread answers): hours of queueing pass in a fraction of a second. More sleeps than `max_sleeps`
    means the launcher kept polling a job that had ended; the test fails instead of hanging."""

    def __init__(self, max_sleeps: int = 400):
        self.elapsed, self.sleeps, self.max_sleeps = 0.0, 0, max_sleeps
        self.epoch = dt.datetime(2026, 12, 4, 8, 0, tzinfo=dt.timezone.utc).timestamp()

    def monotonic(self) -> float:
        return self.elapsed

    def wall(self) -> float:
        return self.epoch + self.elapsed

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        if self.sleeps > self.max_sleeps:
            raise AssertionError(f"the launcher was still polling after {self.max_sleeps} polls")
        self.elapsed += seconds
        time.sleep(0.002)


@functools.cache
def _p5_manifest(owner: tuple | None = None) -> dict:
    # the shipped profile's RayJob; the launcher reads only its metadata, so the job config is a small one
    return build_rayjob(load_profile("hyperpod-p5"), "tiny-grpo", RUN, extra_overrides={"mazes_per_step": 48},
                        owner=dict(owner) if owner else None)


def p5_manifest(owner: dict | None = None) -> dict:
    return copy.deepcopy(_p5_manifest(tuple(owner.items()) if owner else None))


def launcher(srv: K8sAPIServer, clock: FakeTime, logs: list[str]) -> RayJobLauncher:
    return RayJobLauncher(custom_objects_api(host=srv.url), NS, poll_s=60.0, log=logs.append, clock=clock.monotonic,
                          sleep=clock.sleep, wall_clock=clock.wall)


def server_state(script: list[dict], clock: FakeTime) -> ClusterState:
    return ClusterState(script=script, now=clock.wall)


# ---- every JobDeploymentStatus -------------------------------------------------------------------------
@pytest.mark.parametrize("status, meaning", [
    ("", "waiting for the KubeRay operator"), ("Initializing", "starting its Ray cluster"), ("Running", "driver is running"),
    ("Waiting", "waiting for a job to be submitted"), ("Suspending", "Kueue suspended it"),
    ("Suspended", "waiting for Kueue to admit it"), ("Retrying", "KubeRay starts another")])
def test_a_status_that_does_not_end_the_job_is_reported_and_waited_out(status, meaning):
    clock, logs = FakeTime(), []
    state = server_state([{"jobDeploymentStatus": status}] * 3 + [{"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}],
                         clock)
    with K8sAPIServer(state) as srv:
        outcome = launcher(srv, clock, logs).run(p5_manifest(), DEADLINE_S)
    assert outcome.succeeded
    assert any(line.startswith(f"RayJob {outcome.name}: {status or 'New'}: ") and meaning in line for line in logs), logs


@pytest.mark.parametrize("status", [
    {"jobDeploymentStatus": "ValidationFailed", "reason": "ValidationFailed",
     "message": "The RayJob spec is invalid: a RayJob with shutdownAfterJobFinishes set to false is not allowed to be suspended"},
    {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "reason": "AppFailed", "message": "entrypoint exited 1"},
    {"jobDeploymentStatus": "Complete", "jobStatus": "STOPPED"}])
def test_a_final_failure_fails_the_task_at_once_with_the_operators_words(status):
    clock, logs = FakeTime(max_sleeps=5), []
    with K8sAPIServer(server_state([{"jobDeploymentStatus": "Initializing"}, status], clock)) as srv:
        with pytest.raises(LauncherError) as err:
            launcher(srv, clock, logs).run(p5_manifest(), DEADLINE_S)
    assert clock.sleeps == 1  # the poll that saw it ended the wait
    assert (status.get("message") or "job status STOPPED") in str(err.value)
    if status["jobDeploymentStatus"] == "ValidationFailed":
        assert "rejected by the KubeRay operator" in str(err.value)


def test_a_status_mazerl_does_not_know_is_logged_and_waited_out():
    clock, logs = FakeTime(), []
    # Scheduling: in KubeRay's main branch for a while (cron RayJobs), reverted before any release
    state = server_state([{"jobDeploymentStatus": "Scheduling"},
                          {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}], clock)
    with K8sAPIServer(state) as srv:
        assert launcher(srv, clock, logs).run(p5_manifest(), DEADLINE_S).succeeded
    assert any("Scheduling: a status this version of mazerl does not know" in line for line in logs)


def test_a_rejected_job_is_replaced_by_a_retried_task_and_removed_by_cleanup():
    """A ValidationFailed job is never reconciled again (no TTL removes it): a retry replaces it, the
    exit handler deletes it."""
    clock, logs = FakeTime(), []
    rejected = {"jobDeploymentStatus": "ValidationFailed", "reason": "ValidationFailed", "message": "bad spec"}
    with K8sAPIServer(server_state([rejected], clock)) as srv:
        run = launcher(srv, clock, logs)
        with pytest.raises(LauncherError, match="bad spec"):
            run.run(p5_manifest(), DEADLINE_S)
        assert run.cancel_run(RUN) == [job_name(RUN)] and srv.state.jobs == {}
        run.submit(p5_manifest())
        srv.state.jobs[(NS, job_name(RUN))]["status"] = rejected
        srv.state.script = [{"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}]
        assert run.run(p5_manifest(), DEADLINE_S).succeeded
    assert any("earlier attempt failed (ValidationFailed: bad spec); deleting it" in line for line in logs)


# ---- the deadline counts from status.startTime ---------------------------------------------------------
def test_time_queued_in_kueue_does_not_count_against_the_deadline_and_is_reported():
    """As KubeRay does with Kueue: New, Initializing (a first startTime), Suspending, Suspended for 60 h
    (longer than the 48 h deadline), admitted: New, Initializing (a new startTime), 10 h Running, Complete."""
    clock, logs = FakeTime(max_sleeps=1000), []
    polls = {"Suspended": 360, "Running": 60}  # the launcher polls every 10 minutes here
    script = ([{"jobDeploymentStatus": ""}, {"jobDeploymentStatus": "Initializing"}, {"jobDeploymentStatus": "Suspending"}]
              + [{"jobDeploymentStatus": "Suspended"}] * polls["Suspended"]
              + [{"jobDeploymentStatus": ""}, {"jobDeploymentStatus": "Initializing"}]
              + [{"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}] * polls["Running"]
              + [{"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}])
    with K8sAPIServer(server_state(script, clock)) as srv:
        run = launcher(srv, clock, logs)
        run.poll_s = 600.0
        outcome = run.run(p5_manifest(), DEADLINE_S)
    assert outcome.succeeded
    assert 60 * HOUR <= outcome.queued_s <= 61 * HOUR
    started = dt.datetime.fromisoformat(outcome.started_at.replace("Z", "+00:00")).timestamp()
    assert 60 * HOUR <= started - clock.epoch <= 61 * HOUR  # the second startTime: where the deadline counts from
    queue_reports = [line for line in logs if "queued for" in line and "its deadline has not started" in line]
    assert 60 * HOUR / 1200 <= len(queue_reports) <= 60 * HOUR / 900  # about every 15 minutes of the queue
    assert any(re.search(r"started after 60\.\d h queued", line) for line in logs), logs[-5:]


def test_a_job_running_past_its_deadline_with_the_operator_silent_is_deleted_and_fails():
    clock, logs = FakeTime(max_sleeps=50), []
    began = dt.datetime.fromtimestamp(clock.epoch - 49 * HOUR, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    running = {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "startTime": began}
    with K8sAPIServer(server_state([running], clock)) as srv:
        with pytest.raises(LauncherError) as err:
            launcher(srv, clock, logs).run(p5_manifest(), DEADLINE_S)  # adopts nothing: creates, sees it 49 h in
        assert srv.state.jobs == {}
    assert f"started at {began}" in str(err.value) and "KubeRay operator is not ending it; deleted it" in str(err.value)
    assert clock.sleeps == 0


# ---- the owner reference -------------------------------------------------------------------------------
POD = {"MAZERL_POD_NAME": "mazerl-abc-train-grpo-123", "MAZERL_POD_UID": "5b0e7c1a-0000-4000-8000-00000000abcd",
       "MAZERL_POD_NAMESPACE": NS}


def test_the_rayjob_is_owned_by_the_launching_pod_and_by_nothing_outside_one():
    from kubernetes.client import V1OwnerReference

    owner, said = launcher_pod_owner(POD, NS)
    manifest = p5_manifest(owner)
    (ref,) = manifest["metadata"]["ownerReferences"]
    V1OwnerReference(api_version=ref["apiVersion"], kind=ref["kind"], name=ref["name"], uid=ref["uid"],
                     controller=ref["controller"], block_owner_deletion=ref["blockOwnerDeletion"])  # the API's required fields
    assert (ref["apiVersion"], ref["kind"]) == ("v1", "Pod")
    assert (ref["name"], ref["uid"]) == (POD["MAZERL_POD_NAME"], POD["MAZERL_POD_UID"])
    assert ref["controller"] is False and "deleted with it" in said
    assert launcher_pod_owner({}, NS)[0] is None  # a local run
    assert "ownerReferences" not in p5_manifest()["metadata"]
    elsewhere, why = launcher_pod_owner({**POD, "MAZERL_POD_NAMESPACE": "kubeflow"}, NS)
    assert elsewhere is None and "an owner must share the namespace" in why


def test_a_retried_task_adopting_the_job_says_which_pod_still_owns_it():
    clock, logs = FakeTime(), []
    first, _ = launcher_pod_owner(POD, NS)
    retry, _ = launcher_pod_owner({**POD, "MAZERL_POD_NAME": "mazerl-abc-train-grpo-456", "MAZERL_POD_UID": "u-2"}, NS)
    with K8sAPIServer(server_state([{"jobDeploymentStatus": "Running"}], clock)) as srv:
        launcher(srv, clock, logs).submit(p5_manifest(first))
        launcher(srv, clock, logs).submit(p5_manifest(retry))
        assert srv.state.jobs[(NS, job_name(RUN))]["metadata"]["ownerReferences"] == [first]
    assert logs[-1].endswith(f"owned by that attempt's pod {POD['MAZERL_POD_NAME']}, and deleted with it)")


def test_the_train_task_gets_its_pod_s_name_uid_and_namespace_from_the_downward_api(tmp_path):
    from kfp import compiler

    from mazerl.cluster.rayjob import POD_ENV_FIELDS
    from mazerl.pipelines.dag import build_pipeline

    compiler.Compiler().compile(build_pipeline(load_profile("hyperpod-p5")), str(tmp_path / "p.yaml"))  # the DAG alone
    platform = list(yaml.safe_load_all((tmp_path / "p.yaml").read_text()))[1]
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert {e["name"]: e["fieldPath"] for e in executors["exec-train-grpo"]["fieldPathAsEnv"]} == POD_ENV_FIELDS
    assert POD_ENV_FIELDS == {"MAZERL_POD_NAME": "metadata.name", "MAZERL_POD_UID": "metadata.uid",
                              "MAZERL_POD_NAMESPACE": "metadata.namespace"}


# ---- SIGTERM: KFP terminating the run ------------------------------------------------------------------
TRAIN_TASK = """
import sys
from mazerl.workflow import train_grpo
train_grpo("tiny-base", sys.argv[1], "tiny-grpo", sys.argv[2], {"mazes_per_step": 48}, backend="rayjob",
           profile_json=sys.argv[3], run_id=sys.argv[4])
"""


def test_a_terminated_train_task_deletes_its_rayjob(small_mazes, tmp_path):
    """The train task as KFP runs it (mazerl.workflow.train_grpo, backend rayjob) in its own process,
    in a 'pod' (the downward API's variables): it creates the RayJob, owned by the pod, follows it, and
    on SIGTERM (what a terminated KFP run sends) deletes it and ends saying so."""
    base = load_profile("hyperpod-p5")
    profile = base.model_copy(update={
        "storage": base.storage.model_copy(update={"root": str(tmp_path / "root"), "fsx_mount_path": str(tmp_path / "fsx")}),
        "sagemaker": None})
    with K8sAPIServer(ClusterState(script=[{"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}])) as srv:
        kubeconfig = tmp_path / "kubeconfig"
        write_kubeconfig(kubeconfig, srv.url, "t0ken")
        env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
        env.update(POD, KUBECONFIG=str(kubeconfig), PYTHONUNBUFFERED="1")
        proc = subprocess.Popen([sys.executable, "-c", TRAIN_TASK, str(small_mazes), str(tmp_path / "out"),
                                 profile.model_dump_json(), RUN], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        try:
            for _ in range(1200):  # until the job exists and has been polled
                if any(v == "get" and p.endswith(job_name(RUN)) for v, p in list(srv.state.requests)) or proc.poll() is not None:
                    break
                time.sleep(0.1)
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            job = srv.state.jobs[(NS, job_name(RUN))]
            proc.send_signal(signal.SIGTERM)
            output, _ = proc.communicate(timeout=120)
        finally:
            proc.kill()
        assert ("delete", f"/apis/ray.io/v1/namespaces/{NS}/rayjobs/{job_name(RUN)}") in srv.state.requests
        assert srv.state.jobs == {}, output[-3000:]
    assert job["metadata"]["ownerReferences"][0]["uid"] == POD["MAZERL_POD_UID"]
    assert job["metadata"]["labels"][LABEL_RUN] == RUN
    assert proc.returncode != 0
    assert f"stopped by SIGTERM: deleted RayJob {NS}/{job_name(RUN)}" in output.splitlines()[-1], output[-3000:]


@pytest.fixture
def ctrl_c_raises():
    """Ctrl-C as a terminal delivers it: a process started in the background by a non-interactive shell inherits
    SIGINT ignored, and Python then leaves it ignored (the signal would never arrive and the test would wait forever)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_ctrl_c_deletes_the_rayjob_too(ctrl_c_raises):
    logs: list[str] = []
    with K8sAPIServer(ClusterState(script=[{"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}])) as srv:

        def interrupt_once_followed() -> None:
            while not any(v == "get" and p.endswith(job_name(RUN)) for v, p in list(srv.state.requests)):
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=interrupt_once_followed, daemon=True).start()
        run = RayJobLauncher(custom_objects_api(host=srv.url), NS, poll_s=0.05, log=logs.append)
        with pytest.raises(KeyboardInterrupt, match=f"stopped by SIGINT: deleted RayJob {NS}/{job_name(RUN)}"):
            run.run(p5_manifest(), DEADLINE_S)
        assert srv.state.jobs == {}
    assert logs[-1].startswith("stopped by SIGINT: deleted RayJob")
