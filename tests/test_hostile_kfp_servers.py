"""Hostile input (issue #32): KFP servers that lie or stall, schedules that make no sense, broken
kubeconfigs. The real `kfp.Client` talks to the local KFP API server (tests/kfp_api_server.py) on
127.0.0.1 in its hostile modes. Every case ends in one clear message and exit 2, and nothing is
created on the server unless it answered as the KFP API."""

from __future__ import annotations

import json
import os

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from mazerl.cli import app
from mazerl.kfp_remote import KFPError, parse_schedule

from kfp_api_server import KFPServer, KFPState
from conftest import assert_clear_error

runner = CliRunner()
PROFILE = "hyperpod-g5"
SETTINGS = settings(max_examples=int(os.environ.get("MAZERL_PROPERTY_EXAMPLES", "40")), deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
FAST = {"MAZERL_KFP_TIMEOUT": "1"}  # stalls end after 1 s instead of the users' default


def cli(*args, env=None):
    return runner.invoke(app, ["pipeline", *map(str, args)], env=env)


def command(name: str, url: str) -> list[str]:
    """Each server-facing command, as a user would type it."""
    args = {"submit": ["submit"], "schedule": ["schedule", "--every", "24h"], "list": ["list"],
            "disable": ["disable", "recurring-0001"]}[name]
    return [*args, "--profile", PROFILE, "--host", url]


def assert_nothing_created(state: KFPState) -> None:
    assert not [r for r in state.requests if r.method != "GET"], [(r.method, r.path) for r in state.requests]
    assert not (state.pipelines or state.versions or state.experiments or state.runs or state.recurring)


# ------------------------------------------------------------------- answers that are not the API


@pytest.mark.parametrize("name", ["submit", "schedule", "list", "disable"])
def test_a_login_page_behind_a_healthy_healthz_is_refused_before_anything_is_created(name):
    """An auth proxy that lets /healthz through and answers everything else with its login page."""
    with KFPServer(KFPState(hostile="html")) as server:
        result = cli(*command(name, server.url))
    assert_clear_error(result, f"expected the KFP v2beta1 REST API's JSON at {server.url}/apis/v2beta1/",
                       "got text/html", "an HTML page titled 'sign in'")
    assert "no recurring runs" not in result.output and "xxxxxxxxxx" not in result.output
    assert_nothing_created(server.state)


WRONG_SHAPES = [
    {"status": "ok", "items": []},          # another service's JSON
    [],                                     # not an object
    "ok",
    {"pipelines": "mazerl"},                # a known field of the wrong type
    {"pipelines": [["mazerl"]]},
    {"pipelines": [{"display_name": "mazerl"}]},  # a pipeline without its id
    {"total_size": "many"},
]


@pytest.mark.parametrize("body", WRONG_SHAPES, ids=[json.dumps(b) for b in WRONG_SHAPES])
def test_json_of_the_wrong_shape_is_refused_before_the_upload(body):
    with KFPServer(KFPState(hostile="wrong-shape", hostile_body=body)) as server:
        result = cli(*command("submit", server.url))
    assert_clear_error(result, "looking up pipeline 'mazerl'", f"{server.url}/apis/v2beta1/pipelines")
    assert "internal error" not in result.output
    assert_nothing_created(server.state)


def test_two_pipelines_of_one_name_is_an_error_not_a_crash():
    body = {"pipelines": [{"pipeline_id": "p-1"}, {"pipeline_id": "p-2"}]}
    with KFPServer(KFPState(hostile="wrong-shape", hostile_body=body)) as server:
        result = cli(*command("submit", server.url))
    assert_clear_error(result, "looking up pipeline 'mazerl'", server.url, "multiple pipelines")
    assert_nothing_created(server.state)


def test_a_created_object_without_its_id_is_an_error_not_a_crash():
    """The reads answer as KFP, the upload answers 200 `{}`: no pipeline id to go on with."""
    state = KFPState(hostile="wrong-shape", hostile_body={}, hostile_to=lambda r: r.method == "POST")
    with KFPServer(state) as server:
        result = cli(*command("submit", server.url))
    assert_clear_error(result, "uploading pipeline 'mazerl'", "pipeline_id")
    assert len(state.calls("POST", r"/apis/v2beta1/.*")) == 1  # it stopped at the first answer it could not use


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=4)
    | st.sampled_from(["recurring-1", "ENABLE", "2026-11-29T03:00:00Z", "0 0 3 * * *"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["recurringRuns", "recurring_run_id", "display_name", "trigger", "cron_schedule", "cron",
                         "mode", "next_page_token", "total_size", "items", "status"]), inner, max_size=4),
    max_leaves=12)


def test_any_json_answer_to_list_is_listed_or_refused_never_a_crash():
    with KFPServer(KFPState(hostile="wrong-shape")) as server:

        @SETTINGS
        @given(body=JSON_VALUES)
        def check(body):
            server.state.hostile_body = body
            result = cli("list", "--profile", PROFILE, "--host", server.url)
            assert result.exit_code in (0, 2), result.output
            assert "internal error" not in result.output and "Traceback" not in result.output
            if result.exit_code == 2:
                assert "expected the KFP v2beta1 REST API's JSON" in " ".join(result.output.split()), result.output

        check()


# -------------------------------------------------------------------------------------- stalls


@pytest.mark.parametrize("name", ["submit", "list", "disable"])
def test_a_server_that_stalls_after_the_health_check_times_out_clearly(name):
    with KFPServer(KFPState(hostile="stall")) as server:
        result = cli(*command(name, server.url), env=FAST)
    assert_clear_error(result, f"no answer from the KFP API at {server.url} in 1 s", "MAZERL_KFP_TIMEOUT")
    assert_nothing_created(server.state)
    assert len(server.state.requests) == 2  # the health check and one read: a request that got no answer is not sent again


def test_a_health_check_that_stalls_times_out_clearly():
    with KFPServer(KFPState(hostile="stall", hostile_to=lambda r: True)) as server:
        result = cli(*command("list", server.url), env=FAST)
    assert_clear_error(result, f"no answer from the KFP API at {server.url} in 1 s", "connecting")
    assert [r.path for r in server.state.requests] == ["/apis/v2beta1/healthz"]


@pytest.mark.parametrize("value", ["0", "-1", "abc", "nan", "inf", "1e9", ""])
def test_a_bad_timeout_setting_is_refused_before_any_request(value):
    with KFPServer() as server:
        result = cli(*command("list", server.url), env={"MAZERL_KFP_TIMEOUT": value})
    if value == "":  # unset: the default
        assert result.exit_code == 0, result.output
        return
    assert_clear_error(result, "MAZERL_KFP_TIMEOUT", "seconds")
    assert not server.state.requests


# ------------------------------------------------------------------------------------ schedules

# KFP's scheduler reads cron with robfig/cron v1 (6 fields, seconds first; 0-6 or SUN-SAT for the
# weekday; no Quartz L, W or #); a 5-field line would be read with seconds first, so it is refused.
BAD_CRONS = {
    "0 3 * * *": "6 fields",
    "0 0 3 * * * 2026": "6 fields",
    "": "6 fields",
    "60 0 3 * * *": "the second field",
    "0 60 3 * * *": "the minute field",
    "0 0 24 * * *": "the hour field",
    "0 0 3 0 * *": "the day of month field",
    "0 0 3 32 * *": "the day of month field",
    "0 0 3 * 13 *": "the month field",
    "0 0 3 * * 7": "the day of week field",
    "0 0 3 L * *": "the day of month field",
    "0 0 3 ? * MON#2": "the day of week field",
    "0 0 3 1W * *": "the day of month field",
    "0 */0 * * * *": "step",
    "0 5-1 * * * *": "the minute field",
    "0 1,,2 3 * * *": "the minute field",
    "0 0 3 * JANUARY *": "the month field",
    "0 0 3 * * +1": "the day of week field",
    "0 0 \uff13 * * *": "the hour field",  # a full-width digit
    "0 0 3 * * *;reboot": "the day of week field",
    "* 0 3 * * *": "once a minute",
    "*/10 * * * * *": "once a minute",
    "0 0 3 31 2 *": "never",
    "0 0 3 31 4,6,9,11 *": "never",
    "@reboot": "@daily",
    "@every 1h": "--every",
}


@pytest.mark.parametrize("cron", list(BAD_CRONS))
def test_an_invalid_cron_is_refused_before_any_request(cron):
    with KFPServer() as server:
        result = cli("schedule", "--profile", PROFILE, "--host", server.url, "--cron", cron)
    assert_clear_error(result, "--cron", BAD_CRONS[cron], "seconds first")
    assert not server.state.requests


@pytest.mark.parametrize(("cron", "sent"), [
    ("0 0 3 * * *", "0 0 3 * * *"),
    ("0  */15 *\t* * *", "0 */15 * * * *"),
    ("0 0 3 * * MON-FRI", "0 0 3 * * MON-FRI"),
    ("30 0 3 ? jan-mar sun", "30 0 3 ? jan-mar sun"),
    ("0 0 0 29 2 *", "0 0 0 29 2 *"),       # a leap day does come
    ("0 0 3 31 1,2 *", "0 0 3 31 1,2 *"),   # in January
    ("0 0 3 31 2 1", "0 0 3 31 2 1"),       # day of month OR day of week: every Monday in February
    ("0 5/10 1-22/3 * * *", "0 5/10 1-22/3 * * *"),
    ("@daily", "@daily"), ("@weekly", "@weekly"),
])
def test_valid_crons_are_sent_as_kfp_reads_them(cron, sent):
    assert parse_schedule(cron, None) == {"cron_expression": sent}


FIELD_RANGES = [(0, 59), (0, 59), (0, 23), (1, 31), (1, 12), (0, 6)]
FIELD_NAMES = ["second", "minute", "hour", "day of month", "month", "day of week"]


@st.composite
def cron_field(draw, lo, hi, single=False):
    if single:
        return str(draw(st.integers(lo, hi)))
    a = draw(st.integers(lo, hi))
    b = draw(st.integers(a, hi))
    return draw(st.sampled_from(["*", "?", str(a), f"{a}-{b}", f"*/{b - a + 1}", f"{a}/{b - a + 1}",
                                 f"{a}-{b}/{draw(st.integers(1, 9))}", f"{a},{b}"]))


# days 1-28 only: a later day of a restricted month may never come (31 in February), covered above
VALID_CRON = st.tuples(cron_field(0, 59, single=True), cron_field(0, 59), cron_field(0, 23), cron_field(1, 28),
                       cron_field(1, 12), cron_field(0, 6))


@SETTINGS
@given(fields=VALID_CRON)
def test_generated_valid_crons_are_accepted(fields):
    assert parse_schedule(" ".join(fields), None) == {"cron_expression": " ".join(fields)}


@SETTINGS
@given(fields=VALID_CRON, where=st.integers(0, 5), value=st.integers(60, 10**6) | st.integers(-10**6, -1))
def test_generated_out_of_range_fields_are_refused(fields, where, value):
    lo, hi = FIELD_RANGES[where]
    if lo <= value <= hi:
        return
    bad = list(fields)
    bad[where] = str(value)
    with pytest.raises(KFPError, match=f"the {FIELD_NAMES[where]} field"):
        parse_schedule(" ".join(bad), None)


@SETTINGS
@given(text=st.text(max_size=40))
def test_any_cron_text_is_accepted_as_is_or_refused_clearly(text):
    try:
        schedule = parse_schedule(text, None)
    except KFPError as err:
        assert "seconds first" in str(err)
    else:
        assert parse_schedule(schedule["cron_expression"], None) == schedule


BAD_EVERY = ["0m", "0h", "-5m", "30s", "59s", "367d", "8785h", "1.5h", "1w", "24", "", "fortnight", "\u0663h",
             "1e3s", "99999999999999999999d", "5 m m"]


@pytest.mark.parametrize("every", BAD_EVERY)
def test_an_absurd_interval_is_refused_before_any_request(every):
    with KFPServer() as server:
        result = cli("schedule", "--profile", PROFILE, "--host", server.url, "--every", every)
    assert_clear_error(result, "--every", "from 1m to 366d", "90m")
    assert not server.state.requests


@pytest.mark.parametrize(("every", "seconds"), [("60s", 60), ("1m", 60), (" 90m ", 5400), ("366d", 366 * 86400),
                                                ("8784h", 366 * 86400)])
def test_intervals_at_the_bounds(every, seconds):
    assert parse_schedule(None, every) == {"interval_second": seconds}


@SETTINGS
@given(text=st.text(max_size=12))
def test_any_interval_text_is_in_bounds_or_refused(text):
    try:
        seconds = parse_schedule(None, text)["interval_second"]
    except KFPError as err:
        assert "from 1m to 366d" in str(err)
    else:
        assert 60 <= seconds <= 366 * 86400


# ----------------------------------------------------------------------------------- kubeconfig

GOOD_KUBECONFIG = {
    "apiVersion": "v1", "kind": "Config", "current-context": "hp",
    "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
    "users": [{"name": "u", "user": {"token": "t"}}],
    "contexts": [{"name": "hp", "context": {"cluster": "c", "user": "u"}}],
}


def _with(**changes) -> str:
    doc = json.loads(json.dumps(GOOD_KUBECONFIG))
    for dotted, value in changes.items():
        *path, last = dotted.split("__")
        node = doc
        for key in path:
            node = node[int(key)] if isinstance(node, list) else node[key.replace("_", "-")]
        if value is None:
            del node[last.replace("_", "-")]
        else:
            node[last.replace("_", "-")] = value
    return yaml.safe_dump(doc)


BROKEN_KUBECONFIGS = {
    "not-yaml": ("clusters: [oops", "not valid YAML"),
    "a-list": ("- a\n- b\n", "a mapping"),
    "empty": ("", "empty"),
    "binary": (b"\x00\xff\xfe", "UTF-8"),
    "contexts-not-a-list": (_with(contexts=5), "contexts"),
    "context-not-a-mapping": (_with(contexts=[5]), "contexts"),
    "no-current-context": (_with(current_context=None), "current-context"),
    "current-context-unknown": (_with(current_context="gone"), "'gone'"),
    "cluster-unknown": (_with(contexts__0__context__cluster="gone"), "cluster 'gone'"),
    "user-unknown": (_with(contexts__0__context__user="gone"), "user 'gone'"),
    "server-not-a-url": (_with(clusters__0__cluster__server="not a url"), "server"),
    "no-server": (_with(clusters__0__cluster={"insecure-skip-tls-verify": True}), "server"),
    "ca-not-base64": (_with(clusters__0__cluster={"server": "https://x", "certificate-authority-data": "!!"}),
                      "certificate-authority-data"),
    "exec-not-found": (_with(users__0__user={"exec": {"command": "/nonexistent/aws-iam", "args": ["eks", "get-token"],
                                                      "apiVersion": "client.authentication.k8s.io/v1beta1"}}),
                       "/nonexistent/aws-iam"),
    "certificate-user": (_with(users__0__user={"client-certificate-data": "eA==", "client-key-data": "eA=="}), "no token"),
}


@pytest.fixture()
def kubeconfig_at(tmp_path, monkeypatch):
    """Point the kubernetes client at a kubeconfig path (it reads $KUBECONFIG once, at import)."""
    from kubernetes.config import kube_config

    def point(path):
        monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
        return path

    return point


@pytest.mark.parametrize("case", list(BROKEN_KUBECONFIGS))
def test_a_broken_kubeconfig_is_one_clear_error_naming_the_file(case, tmp_path, kubeconfig_at):
    content, fragment = BROKEN_KUBECONFIGS[case]
    path = kubeconfig_at(tmp_path / "config")
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    result = cli("list", "--profile", PROFILE, "--auth", "kube")
    assert_clear_error(result, "--auth kube", str(path), fragment)


@pytest.mark.parametrize("case", ["missing", "directory"])
def test_a_kubeconfig_that_is_not_a_file(case, tmp_path, kubeconfig_at):
    path = kubeconfig_at(tmp_path / "config")
    if case == "directory":
        path.mkdir()
    result = cli("list", "--profile", PROFILE, "--auth", "kube")
    assert_clear_error(result, "--auth kube", str(path), "not found" if case == "missing" else "directory")


def test_a_kube_context_that_is_not_there_names_the_file_and_the_choices(tmp_path, kubeconfig_at):
    path = kubeconfig_at(tmp_path / "config")
    path.write_text(yaml.safe_dump(GOOD_KUBECONFIG))
    result = cli("list", "--profile", PROFILE, "--auth", "kube", "--kube-context", "nope")
    assert_clear_error(result, "'nope'", str(path), "hp")
