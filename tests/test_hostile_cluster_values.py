"""Hostile input (issue #32): cluster values checked by Kubernetes' and AWS's own rules. A profile's
names, label keys and values, tolerations, images, S3 bucket and FSx mount path are refused at load
with a message naming the field and the rule; the RayJob's run id and `--set` overrides are checked
again when it is rendered, against the same job config model its pods will use, and overrides are
rendered so that the pod parses them back identically."""

from __future__ import annotations

import os
import shlex
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from mazerl.cli import app
from mazerl.cluster.rayjob import RayJobSpecError, build_rayjob, entrypoint
from mazerl.config import ConfigError, load_config, parse_overrides
from mazerl.profiles import PROFILE_DIR, load_profile
from mazerl.rl.config import GRPOConfig
from conftest import assert_clear_error

runner = CliRunner()
SETTINGS = settings(max_examples=int(os.environ.get("MAZERL_PROPERTY_EXAMPLES", "40")), deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
RUN = "3f2c1b9e-1111-2222-3333-444455556666"
DIGEST = "sha256:" + "0" * 64


def p5_raw() -> dict:
    return yaml.safe_load((PROFILE_DIR / "hyperpod-p5.yaml").read_text())


def load_raw(raw: dict):
    """load_profile on `raw` written as a profile file (the path every command takes)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "profile.yaml"
        path.write_text(yaml.safe_dump(raw, allow_unicode=True))
        return load_profile(str(path))


def refusal(raw: dict) -> str:
    with pytest.raises(ConfigError) as caught:
        load_raw(raw)
    return str(caught.value)


# ---- valid members of each kind, as Kubernetes and AWS define them -----------------------------------
DNS_LABEL = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True)
DNS_SUBDOMAIN = st.lists(DNS_LABEL, min_size=1, max_size=4).map(".".join).filter(lambda s: len(s) <= 253)
SHORT_SUBDOMAIN = st.lists(DNS_LABEL, min_size=1, max_size=3).map(".".join).filter(lambda s: len(s) <= 63)
LABEL_NAME = st.from_regex(r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]", fullmatch=True)
LABEL_VALUE = st.one_of(st.just(""), LABEL_NAME)
QUALIFIED_NAME = st.one_of(LABEL_NAME, st.tuples(DNS_SUBDOMAIN, LABEL_NAME).map("/".join))
BUCKET = (st.from_regex(r"[a-wyz][a-z0-9]{2,20}(\.[a-z0-9]{1,10}|-[a-z0-9]{1,10}){0,3}", fullmatch=True)
          .filter(lambda b: len(b) <= 63 and not b.endswith(("-s3alias", ".mrap", "--ol-s3", "--x-s3", "--table-s3"))))


def overlong(kind: str, value: str) -> str:
    """`value` made one character longer than its kind allows (and valid otherwise)."""
    if kind == "qualified name":
        prefix, _, name = value.rpartition("/")
        return (prefix + "/" if prefix else "") + "a" * 64
    limit = {"DNS label": 63, "DNS subdomain": 253, "object name": 63, "label value": 63, "bucket name": 63}[kind]
    return (value + "a" * (limit + 1))[: limit + 1]


def hostile(draw, kind: str, value: str) -> str:
    how = draw(st.sampled_from(["trailing newline", "trailing space", "inner space", "uppercase", "too long"]))
    if how == "uppercase" and kind in ("label value", "qualified name"):
        how = "trailing newline"  # uppercase is allowed there
    if how == "trailing newline":
        return value + "\n"
    if how == "trailing space":
        return value + " "
    if how == "inner space":
        return value[:1] + " " + value[1:]
    if how == "uppercase":
        return "A" + value[1:]
    return overlong(kind, value)


def set_path(raw: dict, path: tuple, value) -> None:
    node = raw
    for part in path[:-1]:
        node = node[part] if isinstance(part, int) else node.setdefault(part, {})
    node[path[-1]] = value


# (where the value goes in a profile, the field the message must name, its kind, valid values)
FIELDS = [
    (("namespace",), "namespace", "DNS label", DNS_LABEL),
    (("service_account",), "service_account", "DNS subdomain", DNS_SUBDOMAIN),
    (("storage", "fsx_claim"), "storage.fsx_claim", "DNS subdomain", DNS_SUBDOMAIN),
    (("kueue", "queue_name"), "kueue.queue_name", "object name", SHORT_SUBDOMAIN),
    (("kueue", "priority_class"), "kueue.priority_class", "object name", SHORT_SUBDOMAIN),
    (("node_selector", "<key>"), "node_selector", "qualified name", QUALIFIED_NAME),
    (("node_selector", "example.com/zone"), "node_selector", "label value", LABEL_VALUE),
    (("rayjob", "head_node_selector", "<key>"), "rayjob.head_node_selector", "qualified name", QUALIFIED_NAME),
    (("rayjob", "head_node_selector", "kubernetes.io/os"), "rayjob.head_node_selector", "label value", LABEL_VALUE),
    (("tolerations", 0, "key"), "tolerations.0.key", "qualified name", QUALIFIED_NAME),
    (("tolerations", 1, "value"), "tolerations.1.value", "label value", LABEL_VALUE),
    (("storage", "root"), "storage.root", "bucket name", BUCKET),
]
RULE_WORDS = {"DNS label": "DNS label", "DNS subdomain": "DNS subdomain", "object name": "DNS subdomain",
              "label value": "label value", "qualified name": "qualified name", "bucket name": "bucket name"}


def put(raw: dict, path: tuple, value: str) -> None:
    """Place `value` at `path`; '<key>' means: as a key (with a valid value) beside the existing ones."""
    if path[0] == "tolerations":
        raw["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                              {"key": "example.com/dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]
    if path[-1] == "<key>":
        node = raw
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[value] = "v"
    elif path == ("storage", "root"):
        raw["storage"]["root"] = f"s3://{value}/mazerl"
    else:
        set_path(raw, path, value)


@pytest.mark.parametrize("path, field, kind, valid", FIELDS, ids=[f"{f[1]}:{f[2]}" for f in FIELDS])
@SETTINGS
@given(data=st.data())
def test_every_cluster_name_obeys_its_kubernetes_or_aws_rule(path, field, kind, valid, data):
    value = data.draw(valid, label="valid")
    raw = p5_raw()
    put(raw, path, value)
    load_raw(raw)  # a valid member of the kind loads

    bad = hostile(data.draw, kind, value)
    raw = p5_raw()
    put(raw, path, bad)
    message = refusal(raw)
    assert field in message and RULE_WORDS[kind] in message, message
    assert repr(bad) in message or path[-1] == "<key>", message  # the offending value, escaped, on one line


@pytest.mark.parametrize("field, bad, rule", [
    ("images.runtime", "repo.example.com/mazerl-runtime@" + DIGEST + "\n", "image reference"),
    ("images.runtime", "repo.example.com/Mazerl-Runtime@" + DIGEST, "image reference"),
    ("images.trainer", "repo.example.com/mazerl trainer@" + DIGEST, "image reference"),
    ("images.trainer", "repo.example.com/mazerl-trainer@sha256:" + "0" * 63, "image reference"),
    ("sagemaker.serving_image", " repo.example.com/serve@" + DIGEST, "image reference"),
])
def test_images_are_references_that_a_registry_accepts(field, bad, rule):
    raw = p5_raw()
    set_path(raw, tuple(field.split(".")), bad)
    message = refusal(raw)
    assert field in message and rule in message, message


def test_an_unpinned_trainer_image_loads_but_is_not_rendered_into_a_rayjob():
    raw = p5_raw()
    raw["images"]["trainer"] = "repo.example.com/mazerl-trainer:latest"
    with pytest.raises(ConfigError, match="images.trainer .* is not pinned"):
        build_rayjob(load_raw(raw), "qwen3vl-8b-grpo", RUN)


def test_a_local_profile_may_use_a_tagged_image():
    raw = yaml.safe_load((PROFILE_DIR / "local.yaml").read_text())
    for image in ("python:3.11-slim", "localhost:5000/team/mazerl_runtime:v1.2", "ghcr.io/org/img@" + DIGEST):
        raw["images"]["runtime"] = image
        assert load_raw(raw).images.runtime == image
    raw["images"]["runtime"] = "python:3.11-slim\n"
    assert "image reference" in refusal(raw)


@pytest.mark.parametrize("bucket, why", [
    ("192.168.5.4", "IP address"), ("my..bucket", "'..'"), ("xn--bucket", "xn--"), ("bucket-s3alias", "-s3alias"),
    ("ab", "3-63"), ("a" * 64, "3-63"), ("My-Bucket", "lowercase"), ("bucket-", "begin and end"),
    ("-bucket", "begin and end"),
    ("bucket_name", "lowercase"), ("bucket.mrap", ".mrap"),
])
def test_s3_bucket_names_follow_aws_rules(bucket, why):
    raw = p5_raw()
    raw["storage"]["root"] = f"s3://{bucket}/mazerl"
    message = refusal(raw)
    assert "storage.root" in message and "bucket name" in message and why in message, message


def test_the_checkpoint_store_uses_the_same_bucket_rule():
    """storage.split_s3 (checkpoint_uri, promotions) refuses what a profile refuses, a trailing newline too."""
    from mazerl.storage import StorageError, split_s3

    assert split_s3("s3://mazerl-artifacts/a/b") == ("mazerl-artifacts", "a/b")
    for uri in ("s3://mazerl-artifacts\n", "s3://xn--abc/x", "s3://10.0.0.1/x", "s3://abc-s3alias/x"):
        with pytest.raises(StorageError, match="bucket name"):
            split_s3(uri)


@pytest.mark.parametrize("path, why", [
    ("fsx", "absolute"), ("fsx/mazerl", "absolute"), ("/fsx/../etc", "'..'"), ("/fsx/", "normalized"),
    ("//fsx", "normalized"), ("/fsx/./data", "normalized"), ("/fsx\n", "control"), ("/", "root"),
])
def test_the_fsx_mount_path_is_absolute_and_normalized(path, why):
    raw = p5_raw()
    raw["storage"]["fsx_mount_path"] = path
    message = refusal(raw)
    assert "storage.fsx_mount_path" in message and why in message, message


def test_valid_fsx_mount_paths_load():
    raw = p5_raw()
    for path in ("/fsx", "/mnt/fsx-lustre", "/data/team_a/fsx.1"):
        raw["storage"]["fsx_mount_path"] = path
        assert load_raw(raw).storage.fsx_mount_path == path


@pytest.mark.parametrize("toleration, why", [
    ({"key": "nvidia.com/gpu", "operator": "Exists", "value": "present"}, "Exists"),
    ({"key": "nvidia.com/gpu", "operator": "exists"}, "operator"),
    ({"key": "nvidia.com/gpu", "effect": "NoSchedule\n"}, "effect"),
    ({"key": "nvidia.com/gpu", "operator": "Equal", "value": "yes please"}, "label value"),
    ({"key": "nvidia.com/ gpu"}, "qualified name"),
    ({"operator": "Equal", "value": "x"}, "key"),
])
def test_tolerations_follow_kubernetes_rules(toleration, why):
    raw = p5_raw()
    raw["tolerations"] = [toleration]
    message = refusal(raw)
    assert "tolerations" in message and why in message, message


def test_valid_tolerations_load_and_render_as_kubernetes_reads_them():
    raw = p5_raw()
    raw["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": ""},
                          {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoExecute"},
                          {"operator": "Exists"}]  # no key: tolerates every taint
    profile = load_raw(raw)
    manifest = build_rayjob(profile, "qwen3vl-8b-grpo", RUN)
    spec = manifest["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": ""},
                                   {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoExecute"},
                                   {"operator": "Exists"}]


# ---- IAM role ARNs (mazerl pipeline rbac --iam-role-arn) ---------------------------------------------
IAM_ROLE_ARN = st.builds(
    lambda partition, account, path, name: f"arn:{partition}:iam::{account}:role/{path}{name}",
    st.sampled_from(["aws", "aws-cn", "aws-us-gov"]), st.from_regex(r"[0-9]{12}", fullmatch=True),
    st.sampled_from(["", "service-role/", "team/ml/"]), st.from_regex(r"[A-Za-z0-9_+=,.@-]{1,64}", fullmatch=True))


def rbac(arn: str):
    return runner.invoke(app, ["pipeline", "rbac", "--profile", "hyperpod-p5", "--iam-role-arn", arn])


@SETTINGS
@given(arn=IAM_ROLE_ARN, how=st.sampled_from(["newline", "space", "short account", "user", "s3", "empty name", "prefix"]))
def test_only_iam_role_arns_reach_the_service_account(arn, how):
    from mazerl.cluster_rbac import rbac_manifests

    account = rbac_manifests(load_profile("hyperpod-p5"), arn)[0]
    assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"] == arn
    parts = arn.split(":")
    short_account = ":".join(parts[:4] + [parts[4][:11]] + parts[5:])
    bad = {"newline": arn + "\n", "space": arn.replace(":role/", ":role/ "), "short account": short_account,
           "user": arn.replace(":role/", ":user/"), "s3": "arn:aws:s3:::mazerl-artifacts",
           "empty name": arn.split(":role/")[0] + ":role/", "prefix": "see " + arn}[how]
    with pytest.raises(ConfigError, match="IAM role ARN"):
        rbac_manifests(load_profile("hyperpod-p5"), bad)


def test_rbac_cli_refuses_a_bad_role_arn_and_writes_nothing(tmp_path):
    out = tmp_path / "rbac.yaml"
    result = runner.invoke(app, ["pipeline", "rbac", "--profile", "hyperpod-p5", "--iam-role-arn",
                                 "arn:aws:iam::123456789012:role/mazerl\n", "--out", str(out)])
    assert_clear_error(result, "--iam-role-arn", "IAM role ARN", "arn:aws:iam::<12-digit account id>:role/")
    assert not out.exists()
    ok = rbac("arn:aws:iam::123456789012:role/service-role/mazerl-pipeline")
    assert ok.exit_code == 0, ok.output


# ---- render time: the run id and --set ---------------------------------------------------------------
def render(*args):
    return runner.invoke(app, ["cluster", "render-rayjob", "--profile", "hyperpod-p5", *args])


def pod_view(manifest: dict) -> tuple[str, dict]:
    """The driver's command parsed as its shell and `mazerl train grpo` parse it: (config, overrides)."""
    args = shlex.split(manifest["spec"]["entrypoint"])
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    return args[args.index("--config") + 1], parse_overrides(sets)


@pytest.mark.parametrize("run_id", [RUN + "\n", "run id", "", "x" * 64, "run,other=1", "-run"])
def test_a_run_id_that_cannot_be_a_label_value_is_refused_at_render_time(run_id, tmp_path):
    out = tmp_path / "rayjob.yaml"
    assert_clear_error(render("--run-id", run_id, "--out", str(out)), "run id", "label value")
    assert not out.exists()


def pod_config(manifest: dict) -> GRPOConfig:
    """The job config the driver pod runs (cli/train.py, train_grpo_cmd: the --set overrides, then --backend ray)."""
    config, overrides = pod_view(manifest)
    return load_config(GRPOConfig, config, {**overrides, "distributed.backend": "ray"})


def test_max_minutes_null_reaches_the_pod_as_null():
    """A pipeline's overrides are Python values: None must reach the pod as null, not as the word None."""
    manifest = build_rayjob(load_profile("hyperpod-p5"), "qwen3vl-8b-grpo", RUN,
                            extra_overrides={"max_minutes": None, "optim.lr": 1e-6, "freeze_vision": True})
    cfg = pod_config(manifest)
    assert cfg.max_minutes is None and cfg.optim.lr == 1e-6 and cfg.freeze_vision is True
    result = render("--run-id", RUN, "--set", "max_minutes=null", "--set", "optim.lr=1e-6")
    assert result.exit_code == 0, result.output
    assert pod_config(yaml.safe_load(result.stdout)).max_minutes is None


@pytest.mark.parametrize("sets, fragments", [
    (["no_such_setting=1"], ["no_such_setting", "Extra inputs are not permitted"]),
    (["distributed.no_such=1"], ["distributed.no_such"]),
    (["max_minutes=-5"], ["max_minutes", "greater than 0"]),
    (["steps=ten"], ["steps", "integer"]),
    (["distributed.ranks=16", "distributed.rollout_workers=16"], ["16", "GPUs", "8"]),
    (["distributed.gpus_per_rank=2"], ["GPUs", "8"]),
    (["distributed.gpus_per_rank=16", "distributed.ranks=1", "distributed.rollout_workers=1"], ["GPU", "gpus_per_worker"]),
    (["distributed.cpus_per_actor=100"], ["CPU"]),
])
def test_set_values_the_pod_would_refuse_are_refused_before_rendering(sets, fragments, tmp_path):
    out = tmp_path / "rayjob.yaml"
    args = [a for s in sets for a in ("--set", s)]
    assert_clear_error(render("--run-id", RUN, *args, "--out", str(out)), *fragments)
    assert not out.exists()


def test_a_config_the_renderer_cannot_read_is_named():
    assert_clear_error(render("--config", "/fsx/no/such/grpo.yaml"), "/fsx/no/such/grpo.yaml", "not found")


NUMBER_WORDS = st.sampled_from(["null", "~", "", "90", "1.5e2", "1e-6", "0x10", "007", ".inf", "off", "1_000"])
TEXT = st.text(max_size=16)
# (a setting of the job config, values a pipeline (Python values) or a command line (text) may give it)
SETTINGS_AND_VALUES = [
    ("max_minutes", st.one_of(st.none(), st.floats(0.01, 1e5), NUMBER_WORDS)),
    ("optim.lr", st.one_of(st.floats(1e-9, 1.0), NUMBER_WORDS)),
    ("steps", st.one_of(st.integers(-2, 10**6), st.integers(1, 10**6).map(str), NUMBER_WORDS)),
    ("autocast", st.sampled_from(["off", "bfloat16", "auto", "false", "no"])),
    ("eval_data", st.one_of(st.none(), TEXT, st.sampled_from(["off", "null", "None", "a b", "it's", "x=y", "#c", "[1]"]))),
    ("output_dir", TEXT),
    ("freeze_vision", st.one_of(st.booleans(), st.sampled_from(["true", "false", "yes", "off"]))),
    ("optim.betas", st.one_of(st.lists(st.floats(0.0, 0.99), min_size=1, max_size=3), st.just("[0.9, 0.95]"))),
    ("env.progress_reward", st.one_of(st.floats(-1e3, 1e3), NUMBER_WORDS)),
]


@SETTINGS
@given(overrides=st.lists(st.sampled_from(SETTINGS_AND_VALUES), min_size=1, max_size=3, unique_by=lambda kv: kv[0])
       .flatmap(lambda kvs: st.fixed_dictionaries({k: v for k, v in kvs})))
def test_overrides_reach_the_pod_as_the_job_config_they_mean_here(overrides):
    """Round trip: the config the driver pod reads from the rendered command equals the config the same
    overrides give in this process; overrides that config refuses are refused before rendering."""
    from mazerl.cluster.plan import sizing_overrides

    profile = load_profile("hyperpod-p5")
    try:
        meant = load_config(GRPOConfig, "qwen3vl-8b-grpo",
                            {**sizing_overrides(profile), **overrides, "distributed.backend": "ray"})
    except ConfigError:
        meant = None
    try:
        manifest = build_rayjob(profile, "qwen3vl-8b-grpo", RUN, extra_overrides=overrides)
    except RayJobSpecError as err:
        assert meant is None or "line break or control character" in str(err), err
        event("refused before rendering")
        return
    event("rendered")
    assert meant is not None, overrides
    assert "\n" not in manifest["spec"]["entrypoint"]
    assert pod_config(manifest) == meant


def test_an_override_key_that_cannot_be_carried_is_refused():
    for key in ("a=b", " steps", "steps\n"):
        with pytest.raises(RayJobSpecError, match="override"):
            entrypoint("cfg.yaml", {key: 1})


def test_the_train_step_checks_the_run_id_before_staging_anything(tmp_path):
    from mazerl.cluster.train_step import train_on_rayjob

    base = load_profile("hyperpod-p5")
    profile = base.model_copy(update={"storage": base.storage.model_copy(update={"fsx_mount_path": str(tmp_path / "fsx")})})
    with pytest.raises(RayJobSpecError, match="label value"):
        train_on_rayjob(profile, RUN + "\n", "tiny-base", str(tmp_path / "mazes"), "tiny-grpo", str(tmp_path / "out"),
                        api=SimpleNamespace(), log=lambda _: None)
    assert not (tmp_path / "fsx").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("run_id", ["", "a,b", "x!=y", RUN + "\n"])
def test_cleanup_refuses_a_run_id_that_would_widen_its_label_selector(run_id):
    from mazerl.cluster.train_step import cancel_run

    calls = []
    api = SimpleNamespace(list_namespaced_custom_object=lambda *a, **k: calls.append(k) or {"items": []})
    with pytest.raises(RayJobSpecError, match="run id"):
        cancel_run(load_profile("hyperpod-p5"), run_id, api=api, log=lambda _: None)
    assert calls == []


def test_the_placement_check_asks_for_what_the_ray_backend_places():
    """The render-time placement check and the Ray backend compute the same bundles."""
    from mazerl.cluster.rayjob import placement_bundles
    from mazerl.distributed.ray_grpo import RayGRPO

    for d in ({"placement": "colocated", "ranks": 4, "rollout_workers": 4, "gpus_per_rank": 1, "cpus_per_actor": 3},
              {"placement": "split", "ranks": 2, "rollout_workers": 3, "gpus_per_rank": 1, "gpus_per_rollout_worker": 0.5},
              {"placement": "split", "ranks": 2, "rollout_workers": 2, "gpus_per_rank": 0, "cpus_per_actor": 0.5}):
        overrides = {"distributed.backend": "ray", **{f"distributed.{k}": v for k, v in d.items()}}
        cfg = load_config(GRPOConfig, "qwen3vl-8b-grpo", overrides)
        assert placement_bundles(cfg.distributed) == RayGRPO._bundles(SimpleNamespace(cfg=cfg))
