"""The HyperPod RayJob: the manifest (validated against KubeRay's CRD schema, shipped in tests/data)
and the launcher, through the real kubernetes client against a local API server (mazerl.rehearsal.kube_api)."""

from __future__ import annotations

import json
import re
import shlex
import time
from pathlib import Path

import jsonschema
import pytest
import yaml
from kfp import dsl
from typer.testing import CliRunner

from mazerl.cli import app
from mazerl.cluster.launcher import LauncherError, RayJobLauncher, RBACError, custom_objects_api
from mazerl.cluster.rayjob import LABEL_RUN, RayJobSpecError, build_rayjob, job_name, render
from mazerl.profiles import load_profile

from mazerl.rehearsal.kube_api import ClusterState, K8sAPIServer, self_signed_certificate, write_kubeconfig

CRDS = Path(__file__).parent / "data" / "crds"
RUN = "3f2c1b9e-1111-2222-3333-444455556666"


@pytest.fixture(scope="module")
def rayjob_schema() -> dict:
    crd = yaml.safe_load((CRDS / "ray.io_rayjobs.yaml").read_text())
    return next(v for v in crd["spec"]["versions"] if v["name"] == "v1")["schema"]["openAPIV3Schema"]


def schema_errors(schema: dict, manifest: dict) -> list[str]:
    return [f"{e.json_path}: {e.message}" for e in jsonschema.Draft7Validator(schema).iter_errors(manifest)]


def p5_manifest() -> dict:
    return build_rayjob(load_profile("hyperpod-p5"), "qwen3vl-8b-grpo", RUN)  # a config the renderer can check


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
    assert spec["entrypoint"].startswith("python -m mazerl train grpo --config qwen3vl-8b-grpo --backend ray")
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


def test_a_retried_task_replaces_its_failed_job_and_the_new_one_runs():
    """A retry must retry: the earlier attempt's job failed, so it is deleted and created again (the
    new job resumes from the last checkpoint), rather than adopted and reported failed once more."""
    state = ClusterState(script=[{"jobDeploymentStatus": "Failed", "reason": "AppFailed", "message": "OOM"}])
    logs: list[str] = []
    with K8sAPIServer(state) as srv:
        with pytest.raises(LauncherError, match="AppFailed: OOM"):
            launcher(srv, logs).run(p5_manifest())
        state.script = [{"jobDeploymentStatus": "Running"}, {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}]
        outcome = launcher(srv, logs).run(p5_manifest())
    assert outcome.succeeded
    assert any("earlier attempt failed (AppFailed: OOM); deleting it" in line for line in logs)
    verbs = [v for v, _ in srv.state.requests]
    assert verbs.count("create") == 3 and verbs.count("delete") == 1  # create, create (409), delete, create


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
        with pytest.raises(RBACError, match=f"forbidden to {'create' if verb == 'create' else 'read'} RayJob.*env/k8s \\(mazerl pipeline rbac"):
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
        finished = p5_manifest()
        finished["metadata"]["name"] = job_name(RUN, "eval")
        run.submit(finished)
        srv.state.jobs[("hyperpod-ns-ml-research", job_name(RUN, "eval"))]["status"] = {"jobDeploymentStatus": "Complete"}
        assert run.cancel_run(RUN) == [job_name(RUN)]  # the running one; the finished one stays for KubeRay's TTL
        assert sorted(srv.state.jobs) == [("hyperpod-ns-ml-research", job_name(RUN, "eval")),
                                          ("hyperpod-ns-ml-research", "unrelated-job")]
        assert run.cancel(job_name(RUN)) is False  # already gone: not an error
        with pytest.raises(LauncherError, match="is gone"):
            run.wait(job_name(RUN))


# ---- the pipeline's train step with backend rayjob, end to end ---------------------------------------
def cpu_executor(workdir: Path):
    """Plays KubeRay: runs the RayJob's entrypoint here, with overrides that turn the GPU sizing into
    this machine's CPUs (later --set wins), in a local Ray."""
    import os
    import subprocess
    import sys

    def run(job: dict):
        args = shlex.split(job["spec"]["entrypoint"])
        assert args[:3] == ["python", "-m", "mazerl"]
        args = [sys.executable, *args[1:]]
        for k, v in {"distributed.gpus_per_rank": 0, "distributed.cpus_per_actor": 0.5, "distributed.ranks": 1,
                     "distributed.rollout_workers": 1, "policy.device": "cpu", "policy.engine": "hf"}.items():
            args += ["--set", f"{k}={v}"]
        env = {**os.environ, "RAY_ADDRESS": "", "RAY_AUTH_MODE": "disabled"}
        proc = subprocess.run(args, cwd=workdir, env=env, capture_output=True, text=True, timeout=900)
        (workdir / "entrypoint.log").write_text(proc.stdout + proc.stderr)
        return proc.returncode == 0, f"entrypoint exited {proc.returncode}: {proc.stderr[-500:]}"

    return run


@pytest.mark.slow
def test_train_step_on_rayjob_stages_launches_follows_and_hands_back_the_model(s3, small_mazes, tmp_path):
    """The train task with backend rayjob against a local Kubernetes API whose 'KubeRay' runs the
    job's entrypoint for real on CPU: inputs staged on 'FSx', config validated, RayJob created and
    followed, checkpoints on S3, the final model and a pointer in the task's artifact; cleanup
    deletes the run's job."""
    from conftest import S3_TEST_BUCKET

    from mazerl.cluster.train_step import cancel_run, train_on_rayjob
    from mazerl.metrics import read_metrics
    from mazerl.storage import S3CheckpointStore

    base = load_profile("hyperpod-p5")
    profile = base.model_copy(update={  # one GPU, one rank: a job config of 2 mazes x 2 samples is valid for it
        "storage": base.storage.model_copy(update={"root": f"s3://{S3_TEST_BUCKET}/root", "fsx_mount_path": str(tmp_path / "fsx")}),
        "rayjob": base.rayjob.model_copy(update={"gpus_per_worker": 1}), "sagemaker": None})
    state = ClusterState(executor=cpu_executor(tmp_path))
    logs: list[str] = []
    with K8sAPIServer(state) as srv:
        api = custom_objects_api(host=srv.url)
        final, record = train_on_rayjob(profile, RUN, "tiny-base", str(small_mazes), "tiny-grpo", str(tmp_path / "artifact"),
                                        {"steps": 2, "mazes_per_step": 2, "group_size": 2, "max_turns": 3, "eval_every": 0,
                                         "checkpoint_every": 1, "max_minutes": None},
                                        api=api, log=logs.append, poll_s=0.5)
        assert record["step"] == 2, (tmp_path / "entrypoint.log").read_text()[-3000:]
        run_dir = tmp_path / "fsx" / "mazerl" / "runs" / RUN
        assert (run_dir / "mazes" / "train.parquet").is_file() and (run_dir / "grpo.yaml").is_file()
        # later task pods get the model where they can see it (FSx), not in this pod's artifact folder
        assert Path(final) == run_dir / "grpo" / "final" and (Path(final) / "config.json").is_file()
        assert (Path(final).parent / "metrics.jsonl").is_file()
        assert (tmp_path / "artifact" / "final" / "config.json").is_file()  # and a copy for the UI's lineage
        pointer = json.loads((tmp_path / "artifact" / "run.json").read_text())
        assert pointer["run_directory"] == str(run_dir) and pointer["checkpoint_uri"].endswith(f"/runs/{RUN}/checkpoints")
        assert [r["step"] for r in read_metrics(tmp_path / "artifact" / "metrics.jsonl")] == [1, 2]
        store = S3CheckpointStore(pointer["checkpoint_uri"])
        assert store.latest() == "step-00000002"
        assert any("TensorBoard: tensorboard --logdir" in line for line in logs)
        assert any(line.endswith("Complete, job SUCCEEDED") for line in logs)
        assert cancel_run(profile, RUN, api=api, log=logs.append) == []  # finished: left for KubeRay's TTL
        assert list(srv.state.jobs) == [(profile.namespace, job_name(RUN))]


@pytest.mark.parametrize("workers", [2, 3])
def test_the_train_step_checks_hyperpod_nodes_before_launching(hyperpod, small_mazes, tmp_path, workers):
    """With sagemaker.cluster_name set, the train step asks SageMaker (moto) for enough healthy nodes
    of the node selector's instance type first: too few, and no RayJob is created."""
    from mazerl.cluster.sagemaker import PreflightError
    from mazerl.cluster.train_step import train_on_rayjob

    base = load_profile("hyperpod-p5")
    profile = base.model_copy(update={
        "storage": base.storage.model_copy(update={"root": str(tmp_path / "root"), "fsx_mount_path": str(tmp_path / "fsx")}),
        "rayjob": base.rayjob.model_copy(update={"workers": workers}),
        "sagemaker": base.sagemaker.model_copy(update={"cluster_name": "hp", "model_package_group": None})})

    def finish_at_once(job: dict) -> tuple[bool, str]:
        """A job that 'trains' instantly: the final model appears where the real entrypoint writes it."""
        config = Path(shlex.split(job["spec"]["entrypoint"])[shlex.split(job["spec"]["entrypoint"]).index("--config") + 1])
        final = config.parent / "grpo" / "final"
        final.mkdir(parents=True)
        (final / "config.json").write_text("{}")
        return True, ""

    # 16 or 24 ranks (8 GPUs a worker) must divide a step's 48 x 8 episodes, or the job config is refused before launch
    ranks_divide = {"mazes_per_step": 48}
    logs: list[str] = []
    with K8sAPIServer(ClusterState(executor=finish_at_once)) as srv:
        api = custom_objects_api(host=srv.url)
        if workers == 3:  # moto's cluster has 2 healthy ml.p5.48xlarge nodes
            with pytest.raises(PreflightError, match="2 healthy ml.p5.48xlarge nodes; this job needs 3"):
                train_on_rayjob(profile, RUN, "tiny-base", str(small_mazes), "tiny-grpo", str(tmp_path / "a"), ranks_divide, api=api,
                                log=logs.append, poll_s=0.2)
            assert srv.state.jobs == {}
        else:
            final, _ = train_on_rayjob(profile, RUN, "tiny-base", str(small_mazes), "tiny-grpo", str(tmp_path / "a"),
                                       ranks_divide, api=api, log=logs.append, poll_s=0.2)
            assert logs[0] == "HyperPod preflight: 2 healthy ml.p5.48xlarge nodes in hp"
            assert list(srv.state.jobs) == [(profile.namespace, job_name(RUN))] and Path(final).name == "final"


@pytest.fixture
def in_a_pod(tmp_path, monkeypatch):
    """What Kubernetes gives a pod: KUBERNETES_SERVICE_HOST/PORT and the service account's token and
    CA bundle (files at the paths the client reads, pointed here); an HTTPS API server that demands
    the token. Yields (server, ca_path)."""
    import kubernetes.config.incluster_config as incluster

    cert, key = self_signed_certificate(tmp_path)
    token = tmp_path / "token"
    token.write_text("sa-token-123")
    monkeypatch.setattr(incluster, "SERVICE_TOKEN_FILENAME", str(token))
    monkeypatch.setattr(incluster, "SERVICE_CERT_FILENAME", cert)
    with K8sAPIServer(ClusterState(bearer_token="sa-token-123"), tls=(cert, key)) as srv:
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(srv.port))
        yield srv, cert


def test_in_a_pod_the_launcher_uses_the_service_account_over_tls(in_a_pod):
    srv, _ = in_a_pod
    launcher = RayJobLauncher(custom_objects_api(), "mazerl", poll_s=0.01, log=lambda _: None)
    outcome = launcher.run(p5_manifest(), deadline_s=30)
    assert outcome.succeeded and srv.url.startswith("https://")
    assert ("create", "/apis/ray.io/v1/namespaces/mazerl/rayjobs") in srv.state.requests


def test_in_a_pod_a_bad_token_or_a_foreign_ca_fails_at_once_with_what_to_check(in_a_pod, tmp_path, monkeypatch):
    import kubernetes.config.incluster_config as incluster

    srv, _ = in_a_pod
    srv.state.bearer_token = "another-token"
    with pytest.raises(LauncherError, match="401 Unauthorized.*service account token"):
        RayJobLauncher(custom_objects_api(), "mazerl", log=lambda _: None).submit(p5_manifest())
    srv.state.bearer_token = "sa-token-123"
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    foreign_ca, _ = self_signed_certificate(other_dir, "foreign")
    monkeypatch.setattr(incluster, "SERVICE_CERT_FILENAME", foreign_ca)
    started = time.monotonic()
    with pytest.raises(LauncherError, match="TLS to the Kubernetes API server failed.*ca.crt"):
        RayJobLauncher(custom_objects_api(), "mazerl", log=lambda _: None).submit(p5_manifest())
    assert time.monotonic() - started < 60  # not retried as if the server were down
    assert srv.state.jobs == {}


def test_the_launcher_needs_nothing_beyond_the_shipped_role():
    """Every request the launcher makes (submit, adopt, poll, cancel_run) is a verb the Role grants."""
    from mazerl.cluster_rbac import RULES

    granted = {verb for group, resources, verbs in RULES if group == "ray.io" and "rayjobs" in resources for verb in verbs}
    state = ClusterState(script=[{"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}])
    with K8sAPIServer(state) as srv:
        run = launcher(srv, [])
        run.run(p5_manifest())
        run.run(p5_manifest())  # the retry path: 409, then adopt
        still_running = p5_manifest()
        still_running["metadata"]["name"] = job_name(RUN, "eval")
        run.submit(still_running)
        assert run.cancel_run(RUN) == [job_name(RUN, "eval")]
    used = {"list" if verb == "get" and path.endswith("/rayjobs") else verb for verb, path in srv.state.requests}
    assert used == {"create", "get", "list", "delete"} and used <= granted


CREDENTIAL = re.compile(r"AKIA[0-9A-Z]{16}|ASIA[0-9A-Z]{16}|aws_secret_access_key|AWS_SECRET_ACCESS_KEY|AWS_SESSION_TOKEN|"
                        r"-----BEGIN [A-Z ]*PRIVATE KEY-----|password\s*[:=]", re.I)


def test_hyperpod_p5_compile_and_render_validate_and_carry_no_credential(tmp_path, rayjob_schema, monkeypatch):
    """The target: `pipeline compile --profile hyperpod-p5` + `cluster render-rayjob` give manifests that
    validate (0 errors) and contain no credential, even with AWS credentials in the environment."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAABCDEFGHIJKLMNOP")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-value-that-must-not-leak")
    runner = CliRunner()
    compiled = runner.invoke(app, ["pipeline", "compile", "--profile", "hyperpod-p5", "--out", str(tmp_path / "p.yaml")])
    rendered = runner.invoke(app, ["cluster", "render-rayjob", "--profile", "hyperpod-p5", "--run-id", RUN,
                                   "--out", str(tmp_path / "rayjob.yaml")])
    assert compiled.exit_code == 0 and rendered.exit_code == 0, compiled.output + rendered.output
    for path in (tmp_path / "p.yaml", tmp_path / "rayjob.yaml"):
        text = path.read_text()
        assert not CREDENTIAL.search(text) and "s3cr3t" not in text, path
    assert schema_errors(rayjob_schema, yaml.safe_load((tmp_path / "rayjob.yaml").read_text())) == []
    spec, platform = list(yaml.safe_load_all((tmp_path / "p.yaml").read_text()))[:2]
    executors = spec["deploymentSpec"]["executors"]
    # training is the RayJob's; evaluation of the 8B model gets a GPU of its own
    assert executors["exec-evaluate"]["container"]["resources"]["accelerator"]["resourceCount"] == "1"
    assert "accelerator" not in executors["exec-train-grpo"]["container"].get("resources", {})
    # cleanup is the exit task (runs whatever happened inside) and knows the run, so it can find the run's RayJobs
    cleanup = spec["root"]["dag"]["tasks"]["cleanup"]
    assert cleanup["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
    assert cleanup["inputs"]["parameters"]["run_id"]["runtimeValue"]["constant"] == dsl.PIPELINE_JOB_ID_PLACEHOLDER


def test_the_launcher_reaches_the_cluster_through_a_kubeconfig(tmp_path, monkeypatch):
    """Outside a pod (no service account), the kubeconfig's cluster, user and token are used."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with K8sAPIServer() as srv:
        kubeconfig = tmp_path / "kubeconfig"
        write_kubeconfig(kubeconfig, srv.url, "t0ken")
        api = custom_objects_api(kubeconfig=str(kubeconfig))
        outcome = RayJobLauncher(api, "hyperpod-ns-ml-research", poll_s=0.05, log=lambda _: None).run(p5_manifest())
    assert outcome.succeeded
    with pytest.raises(LauncherError, match="no Kubernetes credentials"):
        custom_objects_api(kubeconfig=str(tmp_path / "missing"))


def test_monitoring_files_scrape_what_the_rayjob_exposes_and_chart_what_mazerl_exports():
    """env/monitoring keeps pods by the labels and port name the manifest sets, and the dashboard
    charts exactly the gauges the Ray driver exports (a renamed metric would leave a blank panel)."""
    from mazerl.distributed.prometheus import EXPORTED, metric_name

    monitoring = Path(__file__).resolve().parents[1] / "env" / "monitoring"
    manifest = p5_manifest()
    head = manifest["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
    assert head["metadata"]["labels"]["app.kubernetes.io/part-of"] == "mazerl"
    assert any(p.get("name") == "metrics" for c in head["spec"]["containers"] for p in c.get("ports", []))
    scrape = yaml.safe_load((monitoring / "prometheus-scrape.yaml").read_text())["scrape_configs"][0]
    keeps = {r["source_labels"][0]: r["regex"] for r in scrape["relabel_configs"] if r.get("action") == "keep"}
    assert keeps == {"__meta_kubernetes_pod_label_app_kubernetes_io_part_of": "mazerl",
                     "__meta_kubernetes_pod_container_port_name": "metrics"}
    monitor = yaml.safe_load((monitoring / "podmonitor.yaml").read_text())
    assert monitor["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/part-of": "mazerl"}
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    dashboard = json.loads((monitoring / "grafana-dashboard.json").read_text())
    charted = {re.match(r"(\w+)", t["expr"]).group(1) for p in dashboard["panels"] for t in p.get("targets", [])}
    exported = {"ray_" + metric_name(k) for k in EXPORTED} | {"ray_mazerl_gpu_memory_gb"}
    assert charted == exported


@pytest.mark.parametrize("change, message", [
    ({"rayjob": None}, "backend rayjob needs a rayjob section"),
    ({"images.trainer": None}, "backend rayjob needs images.trainer"),
    ({"kind": "local", "storage.fsx_claim": None}, "backend rayjob needs kind: hyperpod"),
    ({"rayjob.gpus_per_worker": 0}, "gpus_per_worker"),
    ({"rayjob.workers": 0}, "workers"),
    ({"rayjob.shm_size": "lots"}, "shm_size"),
    ({"rayjob.metrics_port": 80}, "metrics_port"),
    ({"rayjob.unknown_knob": 1}, "unknown_knob"),
    ({"node_selector": {}}, "node_selector has no node.kubernetes.io/instance-type"),
])
def test_bad_rayjob_sizing_in_a_profile_is_refused_by_name(tmp_path, change, message):
    """The RayJob's sizing is validated when the profile loads, with the field named."""
    from mazerl.config import ConfigError
    from mazerl.profiles import PROFILE_DIR

    raw = yaml.safe_load((PROFILE_DIR / "hyperpod-p5.yaml").read_text())
    for dotted, value in change.items():
        *parents, leaf = dotted.split(".")
        node = raw
        for key in parents:
            node = node[key]
        node[leaf] = value
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=message):
        load_profile(str(path))
