"""`mazerl pipeline submit | schedule | list | disable`: the real kfp.Client against a KFP v2beta1
API server on 127.0.0.1 (tests/kfp_api_server.py); assertions are on the requests it received."""

import json
import socket

import pytest
import yaml
from typer.testing import CliRunner

from mazerl.cli import app
from mazerl.kfp_remote import KFPError, parse_schedule
from mazerl.profiles import load_profile
from mazerl.workflow import train_seed_for_run

from kfp_api_server import KFPServer, KFPState

runner = CliRunner()
PROFILE = "hyperpod-g5"  # backend local (hyperpod-p5, backend rayjob, is submitted in its own test)


def cli(*args, env=None):
    return runner.invoke(app, ["pipeline", *args], env=env)


@pytest.fixture()
def kfp():
    with KFPServer(KFPState(token="s3cret", multi_user=True)) as server:
        yield server


def _token_args(server):
    return ["--profile", PROFILE, "--host", server.url, "--auth", "token"]


TOKEN_ENV = {"MAZERL_KFP_TOKEN": "s3cret"}


def test_submit_uploads_the_compiled_pipeline_and_starts_a_run(kfp):
    result = cli("submit", *_token_args(kfp), "--experiment", "nightly", "--param", "grpo_steps=3",
                 "--param", "model=/fsx/models/qwen3-vl-8b", "--param", "min_gain=0", env=TOKEN_ENV)
    assert result.exit_code == 0, result.output
    state, profile = kfp.state, load_profile(PROFILE)
    assert all(r.headers.get("authorization") == "Bearer s3cret" for r in state.requests)

    upload = state.calls("POST", "/apis/v2beta1/pipelines/upload")
    assert len(upload) == 1 and upload[0].query["name"] == "mazerl"
    spec, platform = yaml.safe_load_all(upload[0].body["file"])
    assert spec["pipelineInfo"]["name"] == "mazerl"
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert executors["exec-train-grpo"]["pvcMount"][0]["constant"] == profile.storage.fsx_claim
    train = spec["deploymentSpec"]["executors"]["exec-train-grpo"]["container"]
    assert train["resources"]["accelerator"]["resourceType"] == "nvidia.com/gpu"  # task_gpus: 1
    version = state.calls("POST", "/apis/v2beta1/pipelines/upload_version")
    assert len(version) == 1 and version[0].query["name"].startswith("mazerl-")

    experiment = state.calls("POST", "/apis/v2beta1/experiments")
    assert experiment[0].body == {"display_name": "nightly", "namespace": profile.namespace}
    (run,) = state.calls("POST", "/apis/v2beta1/runs")
    new_version = next(v for v in state.versions.values() if v["display_name"] == version[0].query["name"])
    assert run.body["pipeline_version_reference"] == {"pipeline_id": new_version["pipeline_id"],
                                                      "pipeline_version_id": new_version["pipeline_version_id"]}
    assert run.body["experiment_id"] == next(iter(state.experiments))
    assert run.body["runtime_config"]["parameters"] == {"grpo_steps": 3, "model": "/fsx/models/qwen3-vl-8b", "min_gain": 0.0}
    assert run.body["runtime_config"]["pipeline_root"] == f"{profile.storage.root}/pipeline-root"
    assert run.body["service_account"] == profile.service_account
    assert "pipeline_spec" not in run.body  # the run points at the uploaded version, it does not inline the spec
    run_id = next(iter(state.runs))
    assert f"run '{run.body['display_name']}' started: {run_id}" in result.output
    assert f"{kfp.url}/#/runs/details/{run_id}" in result.output

    # unchanged pipeline: the same version and experiment are reused, nothing is uploaded again
    again = cli("submit", *_token_args(kfp), "--experiment", "nightly", env=TOKEN_ENV)
    assert again.exit_code == 0, again.output
    assert len(state.calls("POST", r"/apis/v2beta1/pipelines/upload.*")) == 2
    assert len(state.calls("POST", "/apis/v2beta1/experiments")) == 1
    runs = state.calls("POST", "/apis/v2beta1/runs")
    assert len(runs) == 2 and runs[1].body["pipeline_version_reference"] == run.body["pipeline_version_reference"]
    assert "unchanged, reused" in again.output


def test_schedule_creates_recurring_runs_then_list_and_disable(kfp):
    cron = cli("schedule", *_token_args(kfp), "--cron", "0 0 3 * * *", "--name", "nightly-retrain", env=TOKEN_ENV)
    assert cron.exit_code == 0, cron.output
    every = cli("schedule", *_token_args(kfp), "--every", "24h", env=TOKEN_ENV)
    assert every.exit_code == 0, every.output
    first, second = kfp.state.calls("POST", "/apis/v2beta1/recurringruns")
    assert first.body["trigger"] == {"cron_schedule": {"cron": "0 0 3 * * *"}}
    assert int(second.body["trigger"]["periodic_schedule"]["interval_second"]) == 86400
    for body in (first.body, second.body):
        assert int(body["max_concurrency"]) == 1 and body["no_catchup"] is True and body["mode"] == "ENABLE"
        assert body["service_account"] == load_profile(PROFILE).service_account
        # no fixed seed: every scheduled run draws fresh training mazes from its run id
        assert "train_seed" not in body["runtime_config"]["parameters"]
    assert first.body["display_name"] == "nightly-retrain" and second.body["display_name"] == "mazerl-hyperpod-g5-retrain"

    kfp.state.max_page_size = 1  # the listing must follow next_page_token
    listed = cli("list", *_token_args(kfp), env=TOKEN_ENV)
    assert listed.exit_code == 0, listed.output
    ids = list(kfp.state.recurring)
    assert all(i in listed.output for i in ids) and "cron 0 0 3 * * *" in listed.output and "every 1d" in listed.output
    assert len(kfp.state.calls("GET", "/apis/v2beta1/recurringruns")) == 2
    assert all(r.query["namespace"] == load_profile(PROFILE).namespace for r in kfp.state.calls("GET", "/apis/v2beta1/recurringruns"))

    disabled = cli("disable", ids[0], "--profile", PROFILE, "--host", kfp.url, "--auth", "token", env=TOKEN_ENV)
    assert disabled.exit_code == 0, disabled.output
    assert kfp.state.calls("POST", rf"/apis/v2beta1/recurringruns/{ids[0]}:disable")
    assert kfp.state.recurring[ids[0]]["mode"] == "DISABLE" and kfp.state.recurring[ids[1]]["mode"] == "ENABLE"
    listed = cli("list", *_token_args(kfp), env=TOKEN_ENV)
    row = next(line for line in listed.output.splitlines() if ids[0] in line)
    assert "no" in row.split()

    missing = cli("disable", "recurring-9999", "--profile", PROFILE, "--host", kfp.url, "--auth", "token", env=TOKEN_ENV)
    assert missing.exit_code == 2 and "HTTP 404" in missing.output and "recurring-9999" in missing.output


def test_single_user_server_gets_no_namespace():
    with KFPServer(KFPState(multi_user=False)) as server:
        result = cli("submit", "--profile", PROFILE, "--host", server.url)
        assert result.exit_code == 0, result.output
        (experiment,) = server.state.calls("POST", "/apis/v2beta1/experiments")
        assert not experiment.body.get("namespace")  # kfp sends "" when no namespace is given
        assert all("authorization" not in r.headers for r in server.state.requests)


def test_kube_context_auth_goes_through_the_api_server_proxy(tmp_path, monkeypatch):
    with KFPServer(KFPState(token="kube-token", multi_user=False)) as server:
        kubeconfig = {
            "apiVersion": "v1", "kind": "Config", "current-context": "other",
            "clusters": [{"name": "hp", "cluster": {"server": server.url}}],
            "users": [{"name": "me", "user": {"token": "kube-token"}}],
            "contexts": [{"name": "hyperpod", "context": {"cluster": "hp", "user": "me"}},
                         {"name": "other", "context": {"cluster": "hp", "user": "me"}}],
        }
        (tmp_path / "config").write_text(yaml.safe_dump(kubeconfig))
        # the kubernetes client reads $KUBECONFIG once, at import: set what that import would have read
        from kubernetes.config import kube_config

        monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(tmp_path / "config"))
        env = {}
        result = cli("submit", "--profile", PROFILE, "--auth", "kube", "--kube-context", "hyperpod", env=env)
        assert result.exit_code == 0, result.output
        assert server.state.requests and all(r.proxied for r in server.state.requests)
        assert all(r.headers["authorization"] == "Bearer kube-token" for r in server.state.requests)
        assert len(server.state.calls("POST", "/apis/v2beta1/runs")) == 1

        bad = cli("submit", "--profile", PROFILE, "--auth", "kube", "--kube-context", "nope", env=env)
        assert bad.exit_code == 2 and "'nope' is not in the kubeconfig" in bad.output and "hyperpod" in bad.output


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bad_requests_fail_clearly_and_send_nothing_wrong(kfp, tmp_path):
    unreachable = cli("submit", "--profile", PROFILE, "--host", f"http://127.0.0.1:{_closed_port()}")
    assert unreachable.exit_code == 2 and "cannot reach the KFP API at http://127.0.0.1:" in unreachable.output

    no_token = cli("submit", *_token_args(kfp), env={"MAZERL_KFP_TOKEN": ""})
    assert no_token.exit_code == 2 and "MAZERL_KFP_TOKEN" in no_token.output
    (tmp_path / "wrong").write_text("not-the-token\n")
    wrong = cli("submit", *_token_args(kfp), "--token-file", str(tmp_path / "wrong"))
    assert wrong.exit_code == 2 and "HTTP 401" in wrong.output and "--auth" in wrong.output

    unknown = cli("submit", *_token_args(kfp), "--param", "grpo_stpes=3", env=TOKEN_ENV)
    assert unknown.exit_code == 2 and "grpo_stpes" in unknown.output and "grpo_steps" in unknown.output
    wrong_type = cli("submit", *_token_args(kfp), "--param", "grpo_steps=many", env=TOKEN_ENV)
    assert wrong_type.exit_code == 2 and "grpo_steps" in wrong_type.output and "integer" in wrong_type.output
    unguardable = cli("submit", *_token_args(kfp), "--param", "guard_loop_splits=heldout,visgym-hard", env=TOKEN_ENV)
    assert unguardable.exit_code == 2 and "guard_loop_splits names 'visgym-hard'" in unguardable.output
    assert "visgym-hard-64" in unguardable.output  # what there is to guard

    five_fields = cli("schedule", *_token_args(kfp), "--cron", "0 3 * * *", env=TOKEN_ENV)
    assert five_fields.exit_code == 2 and "6-field" in five_fields.output and "seconds first" in five_fields.output
    both = cli("schedule", *_token_args(kfp), "--cron", "0 0 3 * * *", "--every", "1d", env=TOKEN_ENV)
    assert both.exit_code == 2 and "exactly one" in both.output

    local = cli("submit", "--profile", "local", "--host", kfp.url)
    assert local.exit_code == 2 and "mazerl pipeline run" in local.output
    # none of the refused commands reached the point of creating anything
    assert not kfp.state.pipelines and not kfp.state.runs and not kfp.state.recurring


@pytest.mark.parametrize(("every", "seconds"), [("90m", 5400), ("24h", 86400), ("7d", 604800), ("120s", 120)])
def test_intervals(every, seconds):
    assert parse_schedule(None, every) == {"interval_second": seconds}


@pytest.mark.parametrize("every", ["fortnight", "0h", "1.5h", "-2h", "24"])
def test_bad_intervals(every):
    with pytest.raises(KFPError, match="not a duration"):
        parse_schedule(None, every)


def test_per_run_training_seed():
    assert train_seed_for_run(7, "any") == 7
    a, b = train_seed_for_run(-1, "run-a"), train_seed_for_run(-1, "run-b")
    assert a != b and a == train_seed_for_run(-1, "run-a") and 0 <= a < 2**31
    assert json.dumps(a)  # a plain int, passed between tasks as a KFP integer
