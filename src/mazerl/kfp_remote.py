"""Talk to a KFP (v2) installation through `kfp.Client`: upload the compiled pipeline, start runs,
create, list and disable recurring runs.

Every server call goes through `_api_call`, which turns transport failures and HTTP errors into a
`KFPError` that names the host, what was attempted and what to check. kfp's own "details: link"
prints are swallowed; callers get ids and UI links back and print them their way.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal

from .errors import UserError
from .pipeline_spec import check_parameters, package_digest, pipeline_name

AuthMode = Literal["none", "token", "kube"]
TOKEN_ENV = "MAZERL_KFP_TOKEN"
_DURATION = re.compile(r"^\s*(\d+)\s*([smhd])\s*$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# the cron dialect of KFP's scheduled workflows: seconds first, 6 fields
_CRON_FIELD = re.compile(r"^[0-9*?/,\-LW#A-Za-z]+$")


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


@contextlib.contextmanager
def _api_call(conn: Connection, what: str) -> Iterator[None]:
    """Translate kfp/urllib3 failures into one clear error; silence kfp's prints."""
    import kfp_server_api
    import urllib3

    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    except kfp_server_api.ApiException as err:
        body = (err.body or b"").decode() if isinstance(err.body, bytes) else str(err.body or "")
        hint = ""
        if err.status in (401, 403):
            hint = "; check --auth (token | kube) and that the credentials may use this KFP namespace"
        elif err.status == 404 and '"message"' not in body:  # not KFP's own "not found": wrong URL or API version
            hint = "; is this a KFP v2 API (…/apis/v2beta1)?"
        raise KFPError(f"{what} failed: {conn.where()} answered HTTP {err.status} {err.reason}: {_snippet(body, 300)}{hint}") from None
    except (urllib3.exceptions.HTTPError, ConnectionError) as err:
        reason = getattr(err, "reason", None) or err
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

    import kfp

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
        health = _health(kwargs)  # once, before kfp.Client, whose own check retries for 25 s
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # "only works with KFP v2.0.0-beta.2 and later"
            client = kfp.Client(**kwargs)
    return Session(client, conn, bool(health.multi_user))


def _health(kwargs: dict[str, Any]):
    """GET /apis/v2beta1/healthz once, with the same host, token and TLS settings kfp.Client will use."""
    import kfp_server_api

    cfg = kfp_server_api.Configuration(host=kwargs["host"].rstrip("/"))
    if kwargs.get("existing_token"):
        cfg.api_key["authorization"] = kwargs["existing_token"]
        cfg.api_key_prefix["authorization"] = "Bearer"
    if kwargs.get("ssl_ca_cert"):
        cfg.ssl_ca_cert = kwargs["ssl_ca_cert"]
    if kwargs.get("verify_ssl") is not None:
        cfg.verify_ssl = kwargs["verify_ssl"]
    cfg.retries = 1
    api = kfp_server_api.HealthzServiceApi(kfp_server_api.ApiClient(cfg))
    raw = api.healthz_service_get_healthz(_request_timeout=30, _preload_content=False)
    body = raw.data.decode("utf-8", errors="replace") if isinstance(raw.data, bytes) else str(raw.data)
    # Anything may answer 200 (a login page, a proxy's index): only a JSON object is KFP's health answer.
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        kind = raw.headers.get("Content-Type", "unknown content") if raw.headers else "unknown content"
        raise KFPError(f"{kwargs['host']} answered /apis/v2beta1/healthz with {kind} ({_snippet(body)}), not KFP's "
                       "JSON: this is not a KFP v2 API endpoint (a login page or another service?); check --host")
    return kfp_server_api.V2beta1GetHealthzResponse(multi_user=bool(doc.get("multi_user", False)))


def _snippet(body: str, limit: int = 120) -> str:
    """The start of a response body on one line; an HTML page is named, not dumped."""
    text = " ".join(body.split())
    if text.lower().startswith(("<!doctype", "<html")) or "<body" in text.lower()[:2000]:
        import re

        title = re.search(r"<title>(.*?)</title>", text, re.IGNORECASE)
        return f"an HTML page{f' titled {title.group(1).strip()!r}' if title else ''}"
    return text[:limit] + ("…" if len(text) > limit else "")


def _through_kube_api(conn: Connection) -> dict[str, Any]:
    """kfp.Client arguments that reach ml-pipeline through the Kubernetes API server's service proxy.

    We resolve the kubeconfig ourselves instead of passing `kube_context` to kfp.Client: the
    kubernetes client's token-refresh hook rewrites the configuration's host on every request,
    dropping the proxy path kfp appended, so requests would land on the API server's root.
    """
    from kubernetes import client as kube_client
    from kubernetes import config as kube_config

    try:
        contexts, _ = kube_config.list_kube_config_contexts()
    except (kube_config.ConfigException, OSError) as err:
        raise KFPError(f"--auth kube: no usable kubeconfig ({err}); set KUBECONFIG or use --auth token|none") from None
    names = [c["name"] for c in contexts]
    if conn.kube_context is not None and conn.kube_context not in names:
        raise KFPError(f"--kube-context {conn.kube_context!r} is not in the kubeconfig: available {', '.join(names) or '(none)'}")
    cfg = kube_client.Configuration()
    try:
        kube_config.load_kube_config(context=conn.kube_context, client_configuration=cfg)
    except (kube_config.ConfigException, OSError) as err:
        raise KFPError(f"--auth kube: cannot load context {conn.kube_context or '(current)'}: {err}") from None
    bearer = cfg.api_key.get("authorization", "")
    if not bearer:
        raise KFPError("--auth kube needs a kubeconfig user with a token or an exec plugin (e.g. aws eks get-token); "
                       "client-certificate users are not supported")
    proxy = f"{cfg.host.rstrip('/')}/api/v1/namespaces/{conn.kfp_namespace}/services/ml-pipeline:http/proxy"
    return {"host": proxy, "existing_token": bearer.removeprefix("Bearer ").strip(),
            "ssl_ca_cert": cfg.ssl_ca_cert, "verify_ssl": cfg.verify_ssl}


# ---------------------------------------------------------------------------- schedules


def parse_schedule(cron: str | None, every: str | None) -> dict[str, Any]:
    """`cron_expression` (6 fields, seconds first, as KFP's scheduler reads it) or `interval_second`."""
    if (cron is None) == (every is None):
        raise KFPError("give exactly one of --cron '<sec> <min> <hour> <day> <month> <weekday>' or --every DURATION (e.g. 24h)")
    if cron is not None:
        fields = cron.split()
        if len(fields) != 6 or not all(_CRON_FIELD.match(f) for f in fields):
            raise KFPError(
                f"--cron {cron!r} is not a 6-field cron expression: KFP reads seconds first, "
                "e.g. '0 0 3 * * *' for 03:00 every day (5-field crontab lines need a leading seconds field)"
            )
        return {"cron_expression": " ".join(fields)}
    m = _DURATION.match(every or "")
    if not m or int(m.group(1)) == 0:
        raise KFPError(f"--every {every!r} is not a duration: a positive whole number with s, m, h or d (e.g. 90m, 24h, 7d)")
    return {"interval_second": int(m.group(1)) * _SECONDS[m.group(2)]}


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
        except ValueError:  # kfp's "No experiment is found with name ..."
            return None


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
    with _api_call(session.conn, f"disabling recurring run {recurring_run_id}"):
        session.client.disable_recurring_run(recurring_run_id)


def ui_link(conn: Connection, kind: Literal["runs", "recurringrun", "pipelines"], ident: str) -> str | None:
    """The pipeline UI page of a run, recurring run or pipeline; the UI shares the API's host.
    None through a kube context (the UI is then reached with a port-forward)."""
    if conn.auth == "kube" or not conn.host:
        return None
    return f"{conn.host.rstrip('/')}/#/{kind}/details/{ident}"
