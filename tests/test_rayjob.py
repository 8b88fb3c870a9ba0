"""The HyperPod RayJob: the manifest (validated against KubeRay's CRD schema, shipped in tests/data)
and the launcher, through the real kubernetes client against a local API server (tests/k8s_api_server.py)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from mazerl.cli import app
from mazerl.cluster.launcher import LauncherError, RayJobLauncher, RBACError, custom_objects_api
from mazerl.cluster.rayjob import LABEL_RUN, RayJobSpecError, build_rayjob, job_name, render
from mazerl.profiles import load_profile

from k8s_api_server import ClusterState, K8sAPIServer

CRDS = Path(__file__).parent / "data" / "crds"
RUN = "3f2c1b9e-1111-2222-3333-444455556666"


@pytest.fixture(scope="module")
def rayjob_schema() -> dict:
    crd = yaml.safe_load((CRDS / "ray.io_rayjobs.yaml").read_text())
    return next(v for v in crd["spec"]["versions"] if v["name"] == "v1")["schema"]["openAPIV3Schema"]


def schema_errors(schema: dict, manifest: dict) -> list[str]:
    return [f"{e.json_path}: {e.message}" for e in jsonschema.Draft7Validator(schema).iter_errors(manifest)]


def p5_manifest() -> dict:
    return build_rayjob(load_profile("hyperpod-p5"), "/fsx/mazerl/runs/r1/grpo.yaml", RUN)


# ---- the manifest ------------------------------------------------------------------------------------
def test_p5_rayjob_validates_against_the_crd(rayjob_schema):
    manifest = p5_manifest()
    assert schema_errors(rayjob_schema, manifest) == []
    spec = manifest["spec"]
    worker = spec["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    limits = worker["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "8" and limits["vpc.amazonaws.com/efa"] == "32"
    assert worker["nodeSelector"]["sagemaker.amazonaws.com/node-health-status"] == "Schedulable"
    assert worker["nodeSelector"]["node.kubernetes.io/instance-type"] == "ml.p5.48xlarge"
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "256Gi"}} in worker["volumes"]
    assert {"name": "fsx", "persistentVolumeClaim": {"claimName": "fsx-claim"}} in worker["volumes"]
    assert {e["name"] for e in worker["containers"][0]["env"]} >= {"FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA"}
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] == 3600
    assert spec["activeDeadlineSeconds"] == 172800 and spec["backoffLimit"] == 0
    labels = manifest["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "hyperpod-ns-ml-research-localqueue"
    assert labels[LABEL_RUN] == RUN
    assert spec["entrypoint"].startswith("python -m mazerl train grpo --config /fsx/mazerl/runs/r1/grpo.yaml --backend ray")
    assert "--set distributed.ranks=8" in spec["entrypoint"] and "--set policy.engine=vllm" in spec["entrypoint"]


def test_the_schema_check_catches_a_wrong_manifest(rayjob_schema):
    manifest = p5_manifest()
    manifest["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = "one"
    del manifest["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
    errors = schema_errors(rayjob_schema, manifest)
    assert any("replicas" in e for e in errors) and any("template" in e for e in errors)


def test_names_are_deterministic_per_run_and_task_and_valid_dns_labels():
    assert job_name(RUN) == job_name(RUN)
    assert job_name(RUN) != job_name(RUN, "eval") != job_name("another-run")
    for name in (job_name(RUN), job_name("x" * 200, "Some Task_With.Odd chars")):
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 40


def test_no_credentials_in_the_manifest():
    text = render(p5_manifest())
    assert not re.search(r"AKIA[0-9A-Z]{16}|aws_secret_access_key|AWS_SECRET|SESSION_TOKEN|password", text, re.I)
    assert "&id" not in text  # plain YAML, no anchors


def test_a_profile_without_rayjob_sizing_is_refused():
    with pytest.raises(RayJobSpecError, match="rayjob section"):
        build_rayjob(load_profile("local"), "cfg.yaml", RUN)


def test_a_run_id_that_cannot_be_a_label_is_refused():
    with pytest.raises(RayJobSpecError, match="label value"):
        build_rayjob(load_profile("hyperpod-p5"), "cfg.yaml", "run id with spaces")


def test_render_rayjob_cli_prints_valid_yaml(rayjob_schema):
    result = CliRunner().invoke(app, ["cluster", "render-rayjob", "--profile", "hyperpod-p5", "--run-id", RUN])
    assert result.exit_code == 0, result.output
    manifest = yaml.safe_load(result.stdout)
    assert schema_errors(rayjob_schema, manifest) == []
    assert manifest["metadata"]["name"] == job_name(RUN)


def test_render_rayjob_refuses_a_profile_that_does_not_use_rayjob():
    result = CliRunner().invoke(app, ["cluster", "render-rayjob", "--profile", "hyperpod-g5"])
    assert result.exit_code == 2
    assert "no rayjob section" in result.output and "Traceback" not in result.output


# ---- the launcher ----------------------------------------------------------------------------------
def launcher(srv: K8sAPIServer, logs: list[str], **kw) -> RayJobLauncher:
    return RayJobLauncher(custom_objects_api(host=srv.url), "hyperpod-ns-ml-research", poll_s=kw.pop("poll_s", 0.05),
                          log=logs.append, **kw)


def test_success_streams_status_changes_and_the_dashboard():
    logs: list[str] = []
    with K8sAPIServer() as srv:
        outcome = launcher(srv, logs).run(p5_manifest())
    assert outcome.succeeded and outcome.job_status == "SUCCEEDED"
    assert [h.split(": ", 1)[1] for h in outcome.history] == ["Initializing", "Running, job RUNNING", "Complete, job SUCCEEDED"]
    assert any(line.startswith("Ray dashboard: http://mazerl-head-svc") for line in logs)
    assert ("create", "/apis/ray.io/v1/namespaces/hyperpod-ns-ml-research/rayjobs") in srv.state.requests


def test_job_failure_fails_the_task_with_its_reason():
    state = ClusterState(script=[{"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"},
                                 {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "reason": "AppFailed",
                                  "message": "Job entrypoint command failed with exit code 2"}])
    with K8sAPIServer(state) as srv, pytest.raises(LauncherError) as err:
        launcher(srv, []).run(p5_manifest())
    assert "failed: AppFailed: Job entrypoint command failed with exit code 2" in str(err.value)


def test_deadline_exceeded_is_reported_as_such():
    state = ClusterState(script=[{"jobDeploymentStatus": "Running"},
                                 {"jobDeploymentStatus": "Failed", "reason": "DeadlineExceeded",
                                  "message": "The RayJob has passed the activeDeadlineSeconds"}])
    with K8sAPIServer(state) as srv, pytest.raises(LauncherError, match="DeadlineExceeded"):
        launcher(srv, []).run(p5_manifest())


def test_a_retried_task_adopts_its_job_instead_of_creating_a_second():
    logs: list[str] = []
    with K8sAPIServer() as srv:
        first = launcher(srv, logs).submit(p5_manifest())
        outcome = launcher(srv, logs).run(p5_manifest())  # the retry: 409, then adopt
    assert outcome.name == first and len(srv.state.jobs) == 1
    assert any(line.startswith("adopted RayJob") for line in logs)


def test_a_job_of_another_run_with_the_same_name_is_not_adopted():
    with K8sAPIServer() as srv:
        other = p5_manifest()
        other["metadata"]["labels"][LABEL_RUN] = "someone-else"
        launcher(srv, []).submit(other)
        with pytest.raises(LauncherError, match="belongs to KFP run 'someone-else'"):
            launcher(srv, []).submit(p5_manifest())


@pytest.mark.parametrize("verb", ["create", "get"])
def test_forbidden_is_a_clear_rbac_error(verb):
    state = ClusterState(forbidden={verb})
    with K8sAPIServer(state) as srv:
        run = launcher(srv, [])
        if verb == "get":
            state.forbidden = set()
            run.submit(p5_manifest())
            state.forbidden = {"get"}
        with pytest.raises(RBACError, match=f"forbidden to {'create' if verb == 'create' else 'read'} RayJob.*env/k8s"):
            run.run(p5_manifest())


@pytest.mark.slow
def test_the_api_server_going_away_for_30_s_mid_poll_is_survived():
    state = ClusterState(script=[{"jobDeploymentStatus": "Running"}] * 3 + [{"jobDeploymentStatus": "Complete",
                                                                            "jobStatus": "SUCCEEDED"}],
                         outage_after_gets=2, outage_s=30.0)
    logs: list[str] = []
    with K8sAPIServer(state) as srv:
        t0 = time.monotonic()
        outcome = launcher(srv, logs, poll_s=0.2, api_outage_s=90.0).run(p5_manifest())
        waited = time.monotonic() - t0
    assert outcome.succeeded
    assert waited >= 30.0  # it really was down that long, and the launcher waited it out
    assert any("Kubernetes API unavailable" in line for line in logs)


def test_an_outage_longer_than_allowed_fails_clearly():
    state = ClusterState(script=[{"jobDeploymentStatus": "Running"}], outage_after_gets=1, outage_s=20.0)
    with K8sAPIServer(state) as srv, pytest.raises(LauncherError, match="did not answer for 2 s"):
        launcher(srv, [], api_outage_s=2.0).run(p5_manifest())


def test_cancel_deletes_the_run_s_jobs_and_leaves_nothing_running():
    state = ClusterState(script=[{"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}])
    with K8sAPIServer(state) as srv:
        run = launcher(srv, [])
        run.submit(p5_manifest())
        other = p5_manifest()
        other["metadata"].update(name="unrelated-job", labels={**other["metadata"]["labels"], LABEL_RUN: "other-run"})
        run.submit(other)
        assert run.cancel_run(RUN) == [job_name(RUN)]
        assert list(srv.state.jobs) == [("hyperpod-ns-ml-research", "unrelated-job")]
        assert run.cancel(job_name(RUN)) is False  # already gone: not an error
        with pytest.raises(LauncherError, match="is gone"):
            run.wait(job_name(RUN))
