"""Talk to a KFP (v2) installation through `kfp.Client`: upload the compiled pipeline, start runs,
create, list and disable recurring runs.

Every server call goes through `_api_call`, which turns transport failures, timeouts, HTTP errors
and answers that are not the KFP API's (see kfp_client.py) into a `KFPError` that names the host,
what was attempted and what to check. Every request has a timeout ($MAZERL_KFP_TIMEOUT seconds,
default 60). kfp's own "details: link" prints are swallowed; callers get ids and UI links back and
print them their way.

Each command's first call after the health check only reads, so a server that is not the KFP API
is found out before anything is created on it.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import math
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal

from .errors import UserError
from .pipeline_spec import check_parameters, package_digest, pipeline_defaults, pipeline_name

AuthMode = Literal["none", "token", "kube"]
TOKEN_ENV = "MAZERL_KFP_TOKEN"
TIMEOUT_ENV = "MAZERL_KFP_TIMEOUT"
DEFAULT_TIMEOUT_S = 60.0  # the longest wait for each answer of the KFP API, unless $MAZERL_KFP_TIMEOUT says otherwise
MAX_TIMEOUT_S = 3600.0


class KFPError(UserError, RuntimeError):
    """A KFP server could not be reached, refused a request, or was asked something invalid."""


@dataclass(frozen=True)
class Connection:
    """How to reach the KFP API.

    auth="none": `host` as is (e.g. a port-forward or an ingress without auth).
    auth="token": `host` with `Authorization: Bearer <token>`.
    auth="kube": through the Kubernetes API server of a kubeconfig context (its credentials, EKS
    exec plugins included) to the ml-pipeline service in `kfp_namespace`; `host` is not used.
    """

    host: str | None
    auth: AuthMode = "none"
    token: str | None = None
    kube_context: str | None = None
    kfp_namespace: str = "kubeflow"
    timeout_s: float = DEFAULT_TIMEOUT_S  # the longest wait for each answer

    def where(self) -> str:
        if self.auth == "kube":
            return f"the KFP API behind kube context {self.kube_context or '(current)'} (service ml-pipeline in {self.kfp_namespace})"
        return f"the KFP API at {self.host}"


def read_token(token_file: str | Path | None) -> str:
    """The bearer token: from a file (e.g. a projected service-account token) or $MAZERL_KFP_TOKEN."""
    if token_file is not None:
        from .config import ConfigError, read_text_file

        path = Path(token_file)
        try:  # read through open(): /dev/fd/N (process substitution) and FIFOs work
            token = read_text_file(path, "--token-file").strip()
        except ConfigError as err:
            raise KFPError(str(err)) from None
        if not token:
            raise KFPError(f"--token-file {path} is empty")
        return token
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise KFPError(f"--auth token needs a token: --token-file PATH or the environment variable {TOKEN_ENV}")
    return token


def timeout_from_env() -> float:
    """Seconds to wait for each answer of the KFP API: $MAZERL_KFP_TIMEOUT, else 60."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= MAX_TIMEOUT_S:  # NaN fails this too
        raise KFPError(f"${TIMEOUT_ENV}={raw!r} is not a number of seconds above 0 and at most {MAX_TIMEOUT_S:g} "
                       f"(the longest wait for each answer of the KFP API; default {DEFAULT_TIMEOUT_S:g})")
    return seconds


@contextlib.contextmanager
def _api_call(conn: Connection, what: str) -> Iterator[None]:
    """Translate kfp/urllib3 failures into one clear error; silence kfp's prints."""
    import kfp_server_api
    import urllib3

    from .kfp_client import NotKFPAnswer, body_snippet

    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    except NotKFPAnswer as err:
        check = "--kube-context and --kfp-namespace" if conn.auth == "kube" else "--host (the profile's kfp_host)"
        effect = ("nothing was created" if err.method == "GET"
                  else "whether it did what was asked is unknown: look in the KFP UI before trying again")
        raise KFPError(f"{what} failed: {err}. Is it a login page, a proxy or another service? Check {check}; "
                       f"{effect}") from None
    except kfp_server_api.ApiException as err:
        body = (err.body or b"").decode() if isinstance(err.body, bytes) else str(err.body or "")
        hint = ""
        if err.status in (401, 403):
            hint = "; check --auth (token | kube) and that the credentials may use this KFP namespace"
        elif err.status == 404 and '"message"' not in body:  # not KFP's own "not found": wrong URL or API version
            hint = "; is this a KFP v2 API (…/apis/v2beta1)?"
        raise KFPError(f"{what} failed: {conn.where()} answered HTTP {err.status} {err.reason}: {body_snippet(body, 300)}{hint}") from None
    except ValueError as err:  # kfp's own checks of an answer, e.g. "Multiple pipelines with the name ..."
        raise KFPError(f"{what} failed: kfp cannot use the answer of {conn.where()}: {err}") from None
    except (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError) as err:
        reason = getattr(err, "reason", None) or err
        refused = isinstance(reason, urllib3.exceptions.NewConnectionError)  # a ConnectTimeoutError too, for urllib3's history
        if isinstance(reason, (urllib3.exceptions.TimeoutError, TimeoutError)) and not refused:
            raise KFPError(f"no answer from {conn.where()} in {conn.timeout_s:g} s ({what}): is it overloaded, or does "
                           f"something between here and it hold requests? ${TIMEOUT_ENV} (seconds) sets how long to wait") from None
        raise KFPError(
            f"cannot reach {conn.where()} ({what}): {reason}. Check --host (the profile's kfp_host) and that it is "
            "reachable from here, e.g. `kubectl port-forward -n kubeflow svc/ml-pipeline-ui 8080:80` and --host http://127.0.0.1:8080"
        ) from None


@dataclass
class Session:
    """A connected `kfp.Client`, how it was reached, and whether the server is multi-user."""

    client: Any
    conn: Connection
    multi_user: bool

    def namespace(self, profile_namespace: str | None) -> str | None:
        """The profile's namespace on a multi-user KFP; None on a single-user one (it has no namespaces)."""
        return profile_namespace if self.multi_user else None


def connect(conn: Connection) -> Session:
    """A client for `conn`; a health call proves the server answers before anything is uploaded."""
    import warnings

    from .kfp_client import GuardedClient

    if conn.auth not in ("none", "token", "kube"):
        raise KFPError(f"unknown auth {conn.auth!r}: allowed none, token, kube")
    if conn.auth != "kube" and not conn.host:
        raise KFPError("no KFP host: give --host URL or set kfp_host in the profile")
    if conn.auth == "token" and not conn.token:
        raise KFPError(f"--auth token needs a token: --token-file PATH or ${TOKEN_ENV}")
    kwargs: dict[str, Any] = {"host": conn.host, "namespace": conn.kfp_namespace}
    if conn.auth == "token":
        kwargs["existing_token"] = conn.token
    elif conn.auth == "kube":
        kwargs.update(_through_kube_api(conn))
    with _api_call(conn, "connecting"):
        health = _health(kwargs, conn.timeout_s)  # once, in place of kfp.Client's, which retries for 25 s
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # "only works with KFP v2.0.0-beta.2 and later"
            client = GuardedClient(health=health, timeout_s=conn.timeout_s, **kwargs)
    return Session(client, conn, bool(health.multi_user))


def _health(kwargs: dict[str, Any], timeout_s: float):
    """GET /apis/v2beta1/healthz once, with the same host, token and TLS settings kfp.Client will use."""
    import kfp_server_api

    from .kfp_client import guard

    cfg = kfp_server_api.Configuration(host=kwargs["host"].rstrip("/"))
    if kwargs.get("existing_token"):
        cfg.api_key["authorization"] = kwargs["existing_token"]
        cfg.api_key_prefix["authorization"] = "Bearer"
    if kwargs.get("ssl_ca_cert"):
        cfg.ssl_ca_cert = kwargs["ssl_ca_cert"]
    if kwargs.get("verify_ssl") is not None:
        cfg.verify_ssl = kwargs["verify_ssl"]
    # anything may answer 200 (a login page, a proxy's index): the guarded client accepts KFP's JSON only
    return kfp_server_api.HealthzServiceApi(guard(kfp_server_api.ApiClient(cfg), timeout_s)).healthz_service_get_healthz()


def _through_kube_api(conn: Connection) -> dict[str, Any]:
    """kfp.Client arguments that reach ml-pipeline through the Kubernetes API server's service proxy.

    We resolve the kubeconfig ourselves instead of passing `kube_context` to kfp.Client: the
    kubernetes client's token-refresh hook rewrites the configuration's host on every request,
    dropping the proxy path kfp appended, so requests would land on the API server's root.
    """
    import yaml
    from kubernetes import client as kube_client
    from kubernetes import config as kube_config

    files = _kubeconfig_files()
    context = _check_kubeconfig(files, conn.kube_context)
    cfg = kube_client.Configuration()
    try:
        kube_config.load_kube_config(context=context, client_configuration=cfg)
    except (kube_config.ConfigException, OSError, ValueError, TypeError, yaml.YAMLError) as err:  # what _check_kubeconfig missed
        raise KFPError(f"--auth kube: cannot use context {context!r} of the kubeconfig {_names(files)}: {err}") from None
    bearer = cfg.api_key.get("authorization", "")
    if not bearer:
        raise KFPError(f"--auth kube: the user of context {context!r} in the kubeconfig {_names(files)} gave no token: "
                       "a token or an exec plugin that prints one (e.g. aws eks get-token) is needed; client-certificate "
                       "users are not supported")
    proxy = f"{cfg.host.rstrip('/')}/api/v1/namespaces/{conn.kfp_namespace}/services/ml-pipeline:http/proxy"
    return {"host": proxy, "existing_token": bearer.removeprefix("Bearer ").strip(),
            "ssl_ca_cert": cfg.ssl_ca_cert, "verify_ssl": cfg.verify_ssl}


def _kubeconfig_files() -> list[Path]:
    """The kubeconfig files the kubernetes client reads: $KUBECONFIG (a list, as for kubectl) as it
    was when the client was imported, else ~/.kube/config."""
    from kubernetes.config import kube_config

    return [Path(p).expanduser() for p in kube_config.KUBE_CONFIG_DEFAULT_LOCATION.split(os.pathsep) if p]


def _names(files: list[Path]) -> str:
    return " + ".join(str(f) for f in files) or "(none)"


def _check_kubeconfig(files: list[Path], context: str | None) -> str:
    """The context to use (`context`, else the current one), once the kubeconfig is checked as far
    as that context needs: readable YAML mappings, its cluster with an http(s) server, its user, and
    the files, base64 data and exec plugin they name. Files merge as in kubectl (the first entry of
    a name wins). Raises a KFPError naming the file and what is wrong."""
    from .config import ConfigError, load_yaml_file

    present = [f for f in files if f.exists()]
    if not present:
        raise KFPError(f"--auth kube: kubeconfig not found: {_names(files)}; set KUBECONFIG or use --auth token|none")
    entries: dict[str, dict[str, tuple[dict, Path]]] = {"contexts": {}, "clusters": {}, "users": {}}
    current: str | None = None
    for path in present:
        try:
            doc = load_yaml_file(path, "kubeconfig")
        except ConfigError as err:
            raise KFPError(f"--auth kube: {err}") from None
        if doc is None:
            raise KFPError(f"--auth kube: the kubeconfig {path} is empty")
        if not isinstance(doc, dict):
            raise KFPError(f"--auth kube: the kubeconfig {path} is not a mapping (apiVersion, kind: Config, clusters, users, contexts)")
        for section, item_key in (("contexts", "context"), ("clusters", "cluster"), ("users", "user")):
            items = doc.get(section) or []
            if not isinstance(items, list):
                raise KFPError(f"--auth kube: the kubeconfig {path}: {section} is not a list")
            for i, item in enumerate(items):
                if not (isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get(item_key), dict)):
                    raise KFPError(f"--auth kube: the kubeconfig {path}: {section}[{i}] is not a mapping with a name "
                                   f"and a {item_key} mapping")
                entries[section].setdefault(item["name"], (item[item_key], path))
        if current is None and doc.get("current-context"):
            current = str(doc["current-context"])
    contexts = entries["contexts"]
    available = ", ".join(contexts) or "(none)"
    if context is None:
        if current is None:
            raise KFPError(f"--auth kube: the kubeconfig {_names(present)} has no current-context: give --kube-context "
                           f"(one of {available})")
        if current not in contexts:
            raise KFPError(f"--auth kube: the kubeconfig {_names(present)} has current-context {current!r}, which is not "
                           f"among its contexts ({available}); give --kube-context")
        context = current
    elif context not in contexts:
        raise KFPError(f"--kube-context {context!r} is not in the kubeconfig {_names(present)}: available {available}")
    spec, path = contexts[context]
    cluster_name, user_name = spec.get("cluster"), spec.get("user")
    if cluster_name not in entries["clusters"]:
        raise KFPError(f"--auth kube: context {context!r} in the kubeconfig {path} names cluster {cluster_name!r}, "
                       f"which is not among its clusters ({', '.join(entries['clusters']) or 'none'})")
    cluster, cluster_path = entries["clusters"][cluster_name]
    server = cluster.get("server")
    if not (isinstance(server, str) and re.fullmatch(r"https?://[^\s/]+(/\S*)?", server)):
        raise KFPError(f"--auth kube: cluster {cluster_name!r} in the kubeconfig {cluster_path} has server {server!r}: "
                       "an http(s) URL of the Kubernetes API server is expected")
    _check_credentials(cluster, f"cluster {cluster_name!r} in the kubeconfig {cluster_path}", cluster_path)
    if user_name is not None:
        if user_name not in entries["users"]:
            raise KFPError(f"--auth kube: context {context!r} in the kubeconfig {path} names user {user_name!r}, "
                           f"which is not among its users ({', '.join(entries['users']) or 'none'})")
        user, user_path = entries["users"][user_name]
        _check_credentials(user, f"user {user_name!r} in the kubeconfig {user_path}", user_path)
        plugin = user.get("exec")
        if plugin is not None:
            command = plugin.get("command") if isinstance(plugin, dict) else None
            if not isinstance(command, str) or not command:
                raise KFPError(f"--auth kube: user {user_name!r} in the kubeconfig {user_path} has an exec plugin without a command")
            if shutil.which(command) is None:
                raise KFPError(f"--auth kube: user {user_name!r} in the kubeconfig {user_path} gets its token from "
                               f"{command!r} (exec plugin), which is not found{' on PATH' if os.sep not in command else ''}")
    return context


def _check_credentials(entry: dict, what: str, path: Path) -> None:
    """The certificate files a cluster or user names exist, and inline certificates are base64."""
    for key in ("certificate-authority-data", "client-certificate-data", "client-key-data"):
        if key in entry:
            try:
                base64.b64decode(str(entry[key]), validate=True)
            except ValueError:
                raise KFPError(f"--auth kube: {what}: {key} is not base64") from None
    for key in ("certificate-authority", "client-certificate", "client-key"):
        if key in entry and not (path.parent / Path(str(entry[key])).expanduser()).is_file():  # relative to the kubeconfig
            raise KFPError(f"--auth kube: {what}: {key} {entry[key]} is not a file")


# ---------------------------------------------------------------------------- schedules


# KFP's scheduler reads cron with robfig/cron v1 (`cron.Parse`): seconds first, then minute, hour,
# day of month, month, day of week; or a descriptor. It would also take 5 fields, still reading
# seconds first (a crontab line "0 3 * * *" would run at minute 3 of every hour): refused here.
_MONTHS = {m: i + 1 for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split())}
_WEEKDAYS = {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())}
_CRON_FIELDS = (  # name, lowest, highest, names allowed for values
    ("second", 0, 59, {}), ("minute", 0, 59, {}), ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}), ("month", 1, 12, _MONTHS), ("day of week", 0, 6, _WEEKDAYS),
)
_CRON_DESCRIPTORS = ("@hourly", "@daily", "@midnight", "@weekly", "@monthly", "@yearly", "@annually")
_CRON_FORMS = ("KFP reads 6 fields, seconds first: 'SECOND MINUTE HOUR DAY-OF-MONTH MONTH DAY-OF-WEEK' "
               "(e.g. '0 0 3 * * *' = 03:00 every day, '0 30 2 * * MON-FRI'), each * or ? or N, N-M, N,M or a step "
               "*/S, N/S, N-M/S; months 1-12 or JAN-DEC, weekdays 0-6 or SUN-SAT; or one of " + " ".join(_CRON_DESCRIPTORS))
_DAYS_IN_MONTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # February 29 does come, in leap years
_DIGITS = re.compile(r"[0-9]+")  # ASCII only: int() would take other scripts' digits too
_INTERVAL = re.compile(r"([0-9]+)\s*([smhd])")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MIN_INTERVAL_S, MAX_INTERVAL_S = 60, 366 * 86400  # a pipeline run at most once a minute, at least once a year


def parse_schedule(cron: str | None, every: str | None) -> dict[str, Any]:
    """`cron_expression` (as KFP's scheduler reads it) or `interval_second`, checked here so that a
    schedule KFP would refuse, or that makes no sense, never reaches the server."""
    if (cron is None) == (every is None):
        raise KFPError("give exactly one of --cron '<sec> <min> <hour> <day> <month> <weekday>' or --every DURATION (e.g. 24h)")
    if cron is not None:
        return {"cron_expression": parse_cron(cron)}
    return {"interval_second": parse_interval(every or "")}


def parse_interval(every: str) -> int:
    """Seconds of `--every`: a whole number with s, m, h or d, from 1 minute to 366 days."""
    m = _INTERVAL.fullmatch(every.strip())
    seconds = int(m.group(1)) * _SECONDS[m.group(2)] if m else None
    if seconds is None or not MIN_INTERVAL_S <= seconds <= MAX_INTERVAL_S:
        raise KFPError(f"--every {every!r} is not a duration from 1m to 366d: a whole number with s, m, h or d "
                       "(e.g. 90m, 24h, 7d); for a time of day use --cron")
    return seconds


def parse_cron(cron: str) -> str:
    """`cron` as KFP will read it (fields joined by single spaces), or a KFPError naming the field
    that is wrong and the forms allowed."""
    text = cron.strip()
    if text.startswith("@"):
        if text in _CRON_DESCRIPTORS:
            return text
        if text.split()[0] == "@every":
            raise KFPError(f"--cron {cron!r}: for an interval use --every (e.g. --every 24h). {_CRON_FORMS}")
        raise KFPError(f"--cron {cron!r} is not a descriptor KFP knows. {_CRON_FORMS}")
    fields = text.split()
    if len(fields) != 6:
        raise KFPError(f"--cron {cron!r} is not a 6-field cron expression (it has {len(fields)}); a 5-field crontab "
                       f"line needs a seconds field in front, e.g. '0 ' + line. {_CRON_FORMS}")
    parsed = [_cron_field(cron, field, *spec) for field, spec in zip(fields, _CRON_FIELDS)]
    if len(parsed[0][0]) != 1:
        raise KFPError(f"--cron {cron!r} would start the pipeline more than once a minute (the second field is "
                       f"{fields[0]!r}): give one second, e.g. 0. {_CRON_FORMS}")
    (days, day_star), (months, _), (_, weekday_star) = parsed[3], parsed[4], parsed[5]
    # robfig/cron: when the day of month or the day of week is * or ?, a day must match both
    # (the other then decides); when both are restricted, either will do
    if (day_star or weekday_star) and not any(d <= _DAYS_IN_MONTH[m - 1] for m in months for d in days):
        raise KFPError(f"--cron {cron!r} never fires: day {','.join(map(str, sorted(days)))} does not occur in month "
                       f"{','.join(map(str, sorted(months)))}. {_CRON_FORMS}")
    return " ".join(fields)


def _cron_field(cron: str, field: str, name: str, low: int, high: int, names: dict[str, int]) -> tuple[set[int], bool]:
    """The values one cron field selects, and whether it has a * or ? (robfig/cron's "star" bit)."""

    def bad(why: str) -> KFPError:
        named = f" or {min(names, key=names.get).upper()}-{max(names, key=names.get).upper()}" if names else ""
        return KFPError(f"--cron {cron!r}: the {name} field {field!r} is not valid: {why} (allowed {low}-{high}{named}). "
                        f"{_CRON_FORMS}")

    def value(text: str) -> int:
        if text.lower() in names:
            return names[text.lower()]
        if not _DIGITS.fullmatch(text):
            raise bad(f"{text!r} is not a number" if text else "a number is missing")
        return int(text)

    selected: set[int] = set()
    star = False
    for item in field.split(","):
        if not item:
            raise bad("an empty item in a list")
        span, slash, step_text = item.partition("/")
        if slash and not (_DIGITS.fullmatch(step_text) and int(step_text) > 0):
            raise bad(f"the step {step_text!r} is not a positive whole number")
        step = int(step_text) if slash else 1
        if span in ("*", "?"):
            start, end, star = low, high, True
        else:
            first, dash, last = span.partition("-")
            start = value(first)
            end = value(last) if dash else (high if slash else start)  # "N/S" runs from N to the field's end
        for number in (start, end):
            if not low <= number <= high:
                raise bad(f"{number} is out of range")
        if start > end:
            raise bad(f"the range {span!r} runs backwards")
        selected.update(range(start, end + 1, step))
    return selected, star


def describe_trigger(trigger) -> str:
    if trigger is None:
        return "-"
    if trigger.cron_schedule is not None:
        return f"cron {trigger.cron_schedule.cron}"
    if trigger.periodic_schedule is not None:
        seconds = int(trigger.periodic_schedule.interval_second or 0)
        for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
            if seconds and seconds % size == 0:
                return f"every {seconds // size}{unit}"
        return f"every {seconds}s"
    return "-"


# ---------------------------------------------------------------------------- server operations


@dataclass(frozen=True)
class Target:
    """Where a run goes and how it runs: the uploaded version, the experiment, the artifact root and
    the service account of its pods."""

    pipeline_id: str
    version_id: str
    experiment_id: str
    namespace: str | None
    pipeline_root: str | None
    service_account: str | None
    uploaded: bool  # False: an unchanged pipeline reused its existing version


def prepare(conn: Connection, package: str | Path, params: dict[str, Any], experiment: str, *, namespace: str | None,
            pipeline_root: str | None, service_account: str | None, description: str = "") -> tuple[Session, Target, dict]:
    """Everything before a run or a schedule: check `params` against the package, connect, upload (or
    reuse) the version, find or create the experiment. Returns the session, the target and the
    checked parameters."""
    params = check_parameters(package, params)
    from .workflow import MODEL_VIEW_PARAMETER, check_guard_parameters, check_model_view

    check_guard_parameters({**pipeline_defaults(package), **params})  # out of range or a split not evaluated: named
    check_model_view(params.get(MODEL_VIEW_PARAMETER))  # an unknown view: a ViewError listing the views
    session = connect(conn)
    namespace = session.namespace(namespace)
    pipeline_id, version_id, uploaded = ensure_pipeline_version(session, package, description)
    experiment_id = ensure_experiment(session, experiment, namespace)
    return session, Target(pipeline_id, version_id, experiment_id, namespace, pipeline_root, service_account, uploaded), params


def ensure_pipeline_version(session: Session, package: str | Path, description: str = "") -> tuple[str, str, bool]:
    """Upload the package as a version of its pipeline (creating the pipeline the first time).

    The version is named after the package's sha256, so re-submitting an unchanged pipeline reuses
    the existing version instead of piling up duplicates. Returns (pipeline_id, version_id, uploaded).
    """
    name = pipeline_name(package)
    version_name = f"{name}-{package_digest(package)[:12]}"
    version_filter = json.dumps({"predicates": [{"operation": "EQUALS", "key": "display_name", "stringValue": version_name}]})
    with _api_call(session.conn, f"looking up pipeline {name!r}"):
        pipeline_id = session.client.get_pipeline_id(name)
    if pipeline_id is None:
        with _api_call(session.conn, f"uploading pipeline {name!r}"):
            pipeline = session.client.upload_pipeline(str(package), pipeline_name=name, description=description)
        pipeline_id = pipeline.pipeline_id
    with _api_call(session.conn, f"looking up version {version_name!r}"):
        found = session.client.list_pipeline_versions(pipeline_id, page_size=1, filter=version_filter).pipeline_versions or []
    if found:
        return pipeline_id, found[0].pipeline_version_id, False
    with _api_call(session.conn, f"uploading version {version_name!r} of pipeline {name!r}"):
        version = session.client.upload_pipeline_version(str(package), version_name, pipeline_id=pipeline_id, description=description)
    return pipeline_id, version.pipeline_version_id, True


def ensure_experiment(session: Session, name: str, namespace: str | None) -> str:
    with _api_call(session.conn, f"finding or creating experiment {name!r}"):
        return session.client.create_experiment(name, namespace=namespace).experiment_id


def find_experiment(session: Session, name: str, namespace: str | None) -> str | None:
    with _api_call(session.conn, f"finding experiment {name!r}"):
        try:
            return session.client.get_experiment(experiment_name=name, namespace=namespace).experiment_id
        except ValueError as err:
            if str(err).startswith("No experiment is found"):
                return None
            raise


def _run_settings(target: Target, params: dict) -> dict[str, Any]:
    """What a run and a recurring run share: the version, the experiment and how the pods run."""
    return {"experiment_id": target.experiment_id, "params": params, "pipeline_id": target.pipeline_id,
            "version_id": target.version_id, "pipeline_root": target.pipeline_root, "service_account": target.service_account}


def start_run(session: Session, target: Target, run_name: str, params: dict) -> str:
    with _api_call(session.conn, f"starting run {run_name!r}"):
        run = session.client.run_pipeline(job_name=run_name, **_run_settings(target, params))
    return run.run_id


def create_schedule(session: Session, target: Target, name: str, schedule: dict, params: dict) -> str:
    """A recurring run for retraining: never two at once, and no backlog of missed runs after a pause."""
    with _api_call(session.conn, f"creating recurring run {name!r}"):
        recurring = session.client.create_recurring_run(
            job_name=name, description="mazerl scheduled retraining", max_concurrency=1, no_catchup=True,
            **_run_settings(target, params), **schedule,
        )
    return recurring.recurring_run_id


@dataclass(frozen=True)
class Schedule:
    id: str
    name: str
    trigger: str
    enabled: bool
    created: str
    experiment_id: str


def list_schedules(session: Session, namespace: str | None, experiment_id: str | None = None) -> list[Schedule]:
    """Every recurring run (all pages), newest first."""
    rows: list[Schedule] = []
    token = ""
    while True:
        with _api_call(session.conn, "listing recurring runs"):
            page = session.client.list_recurring_runs(page_token=token, page_size=100, sort_by="created_at desc",
                                              experiment_id=experiment_id, namespace=namespace)
        for r in page.recurring_runs or []:
            rows.append(Schedule(
                id=r.recurring_run_id, name=r.display_name or "", trigger=describe_trigger(r.trigger),
                enabled=str(r.mode) == "ENABLE", created=str(r.created_at or ""), experiment_id=r.experiment_id or "",
            ))
        token = page.next_page_token or ""
        if not token:
            return rows


def disable_schedule(session: Session, recurring_run_id: str) -> None:
    # read it first: a missing id, or a server that is not the KFP API, is found out before the change
    with _api_call(session.conn, f"looking up recurring run {recurring_run_id}"):
        session.client.get_recurring_run(recurring_run_id)
    with _api_call(session.conn, f"disabling recurring run {recurring_run_id}"):
        session.client.disable_recurring_run(recurring_run_id)


def ui_link(conn: Connection, kind: Literal["runs", "recurringrun", "pipelines"], ident: str) -> str | None:
    """The pipeline UI page of a run, recurring run or pipeline; the UI shares the API's host.
    None through a kube context (the UI is then reached with a port-forward)."""
    if conn.auth == "kube" or not conn.host:
        return None
    return f"{conn.host.rstrip('/')}/#/{kind}/details/{ident}"
