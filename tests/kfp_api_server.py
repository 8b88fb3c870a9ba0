"""A KFP API server on 127.0.0.1 that speaks the v2beta1 REST endpoints mazerl's submit, schedule,
list and disable use, keeps their objects in memory, checks what a real server would refuse
(unknown ids, duplicate version names, bad triggers, unknown parameters, missing auth), and
records every request so tests can assert on what `kfp.Client` actually sent.

It also answers under the Kubernetes API server's service-proxy prefix
(/api/v1/namespaces/<ns>/services/ml-pipeline:http/proxy/...), which is how `kfp.Client` reaches
KFP through a kubeconfig context.

Hostile modes (`KFPState.hostile`) make it answer chosen requests (by default all but the health
check) the way a server in front of or instead of KFP would: "html" (an auth proxy's login page,
200), "wrong-shape" (200 with `KFPState.hostile_body`, JSON that is not the API's), "stall" (never
answers, until the server is closed).
"""

from __future__ import annotations

import email.parser
import email.policy
import itertools
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable
from urllib.parse import parse_qs, urlsplit

import yaml

_PROXY = re.compile(r"^/api/v1/namespaces/[^/]+/services/ml-pipeline:http/proxy")
CREATED = "2026-11-29T03:00:00Z"
HEALTHZ = "/apis/v2beta1/healthz"
LOGIN_PAGE = (b"<!DOCTYPE html><html><head><title>Sign in</title></head>"
              b"<body><form action='/oauth2/start'>" + b"x" * 3000 + b"</form></body></html>")


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: object = None  # parsed JSON, or {"fields": {...}, "file": bytes} for uploads
    proxied: bool = False


@dataclass
class KFPState:
    multi_user: bool = False
    token: str | None = None  # when set, every request needs "Authorization: Bearer <token>"
    max_page_size: int = 100
    pipelines: dict[str, dict] = field(default_factory=dict)
    versions: dict[str, dict] = field(default_factory=dict)  # version id -> version (with its spec)
    experiments: dict[str, dict] = field(default_factory=dict)
    runs: dict[str, dict] = field(default_factory=dict)
    recurring: dict[str, dict] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    hostile: str | None = None  # None | "html" | "wrong-shape" | "stall": see the module docstring
    hostile_body: object = field(default_factory=lambda: {"status": "ok", "items": []})
    hostile_to: Callable[[Request], bool] = lambda r: r.path != HEALTHZ  # which requests get the hostile answer
    released: threading.Event = field(default_factory=threading.Event)  # set when the server closes: stalls end
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))

    def new_id(self, kind: str) -> str:
        return f"{kind}-{next(self._ids):04d}"

    def calls(self, method: str, path_pattern: str) -> list[Request]:
        return [r for r in self.requests if r.method == method and re.fullmatch(path_pattern, r.path)]


class ApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def _matches(obj: dict, filter_json: str | None) -> bool:
    """The subset of KFP's filter language the client uses: EQUALS predicates on string keys."""
    if not filter_json:
        return True
    for p in json.loads(filter_json).get("predicates", []):
        if p.get("operation") not in ("EQUALS", 1):
            raise ApiError(400, f"unsupported filter operation {p.get('operation')!r}")
        if obj.get(p["key"]) != p.get("stringValue"):
            return False
    return True


def _page(items: list[dict], query: dict, state: KFPState, key: str) -> dict:
    size = min(int(query.get("page_size") or 20), state.max_page_size)
    start = int(query.get("page_token") or 0)
    page = items[start:start + size]
    out = {key: page, "total_size": len(items)}
    if start + size < len(items):
        out["next_page_token"] = str(start + size)
    return out


def _public(version: dict) -> dict:
    return {k: v for k, v in version.items() if not k.startswith("_")}


class _Handler(BaseHTTPRequestHandler):
    state: KFPState  # set per server

    def log_message(self, *args):  # keep test output quiet
        pass

    def _reply(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, method: str) -> None:
        url = urlsplit(self.path)
        path, proxied = _PROXY.subn("", url.path)
        path = re.sub(r"/{2,}", "/", path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body: object = None
        ctype = self.headers.get("Content-Type", "")
        if ctype.startswith("multipart/form-data"):
            msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
                f"Content-Type: {ctype}\r\n\r\n".encode() + raw)
            body = {"fields": {}, "file": None}
            for part in msg.iter_parts():
                if part.get_param("name", header="content-disposition") == "uploadfile":
                    body["file"] = part.get_payload(decode=True)
                else:
                    body["fields"][part.get_param("name", header="content-disposition")] = part.get_content()
        elif raw:
            body = json.loads(raw)
        req = Request(method, path, query, {k.lower(): v for k, v in self.headers.items()}, body, bool(proxied))
        self.state.requests.append(req)
        if self.state.hostile and self.state.hostile_to(req):
            self._hostile_answer()
            return
        try:
            if self.state.token is not None and req.headers.get("authorization") != f"Bearer {self.state.token}":
                raise ApiError(401, "Unauthenticated: missing or wrong bearer token")
            status, payload = route(self.state, req)
        except ApiError as err:
            status, payload = err.status, {"code": {400: 3, 401: 16, 404: 5, 409: 6}.get(err.status, 2), "message": err.message}
        self._reply(status, payload)

    def _hostile_answer(self) -> None:
        mode = self.state.hostile
        if mode == "stall":
            self.state.released.wait(60)  # no answer at all; the client's timeout has to end this
            self.close_connection = True
            return
        if mode == "html":
            data, ctype = LOGIN_PAGE, "text/html; charset=utf-8"
        elif mode == "wrong-shape":
            data, ctype = json.dumps(self.state.hostile_body).encode(), "application/json"
        else:
            raise ValueError(f"unknown hostile mode {mode!r}")
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._handle("GET")

    def do_POST(self):
        self._handle("POST")


def route(s: KFPState, r: Request) -> tuple[int, dict]:
    p = r.path
    if r.method == "GET" and p == HEALTHZ:
        return 200, {"multi_user": s.multi_user}

    if r.method == "GET" and p == "/apis/v2beta1/pipelines":
        items = [x for x in s.pipelines.values() if _matches(x, r.query.get("filter"))]
        return 200, _page(items, r.query, s, "pipelines")
    if r.method == "POST" and p == "/apis/v2beta1/pipelines/upload":
        name = r.query.get("name") or ""
        spec = _read_package(r)
        if any(x["display_name"] == name for x in s.pipelines.values()):
            raise ApiError(409, f"pipeline {name!r} already exists")
        pid = s.new_id("pipeline")
        s.pipelines[pid] = {"pipeline_id": pid, "display_name": name, "name": name,
                            "description": r.query.get("description", ""), "created_at": CREATED}
        _add_version(s, pid, name, r.query.get("description", ""), spec)  # as KFP does: a first version, same name
        return 200, s.pipelines[pid]
    if r.method == "POST" and p == "/apis/v2beta1/pipelines/upload_version":
        pid = r.query.get("pipelineid") or ""
        if pid not in s.pipelines:
            raise ApiError(404, f"pipeline {pid!r} not found")
        name = r.query.get("name") or ""
        if any(v["pipeline_id"] == pid and v["display_name"] == name for v in s.versions.values()):
            raise ApiError(409, f"pipeline version {name!r} already exists")
        return 200, _public(_add_version(s, pid, name, r.query.get("description", ""), _read_package(r)))
    m = re.fullmatch(r"/apis/v2beta1/pipelines/([^/]+)/versions", p)
    if r.method == "GET" and m:
        if m.group(1) not in s.pipelines:
            raise ApiError(404, f"pipeline {m.group(1)!r} not found")
        items = [_public(v) for v in reversed(list(s.versions.values()))
                 if v["pipeline_id"] == m.group(1) and _matches(v, r.query.get("filter"))]
        return 200, _page(items, r.query, s, "pipeline_versions")

    if r.method == "GET" and p == "/apis/v2beta1/experiments":
        ns = r.query.get("namespace")
        items = [x for x in s.experiments.values() if _matches(x, r.query.get("filter")) and (ns is None or x["namespace"] == ns)]
        return 200, _page(items, r.query, s, "experiments")
    if r.method == "POST" and p == "/apis/v2beta1/experiments":
        body = r.body or {}
        if s.multi_user and not body.get("namespace"):
            raise ApiError(400, "a multi-user deployment needs the experiment's namespace")
        eid = s.new_id("experiment")
        s.experiments[eid] = {"experiment_id": eid, "display_name": body.get("display_name"),
                              "namespace": body.get("namespace") or "", "created_at": CREATED, "storage_state": "AVAILABLE"}
        return 200, s.experiments[eid]

    if r.method == "POST" and p == "/apis/v2beta1/runs":
        body = _check_run_body(s, r.body or {})
        rid = s.new_id("run")
        s.runs[rid] = {**body, "run_id": rid, "state": "PENDING", "created_at": CREATED}
        return 200, s.runs[rid]

    if r.method == "POST" and p == "/apis/v2beta1/recurringruns":
        body = _check_run_body(s, r.body or {})
        trigger = body.get("trigger") or {}
        cron = (trigger.get("cron_schedule") or {}).get("cron")
        interval = (trigger.get("periodic_schedule") or {}).get("interval_second")
        if (cron is None) == (interval is None):
            raise ApiError(400, "a recurring run needs exactly one of cron_schedule and periodic_schedule")
        if cron is not None and len(cron.split()) != 6:
            raise ApiError(400, f"invalid cron {cron!r}: 6 fields expected")
        if interval is not None and int(interval) <= 0:
            raise ApiError(400, "interval_second must be positive")
        rid = s.new_id("recurring")
        mode = body.get("mode") or "ENABLE"
        s.recurring[rid] = {**body, "recurring_run_id": rid, "mode": mode, "created_at": CREATED,
                            "status": "ENABLED" if mode == "ENABLE" else "DISABLED",
                            "namespace": s.experiments[body["experiment_id"]]["namespace"]}
        return 200, s.recurring[rid]
    if r.method == "GET" and p == "/apis/v2beta1/recurringruns":
        ns, eid = r.query.get("namespace"), r.query.get("experiment_id")
        items = [x for x in reversed(list(s.recurring.values()))
                 if (ns is None or x["namespace"] == ns) and (eid is None or x["experiment_id"] == eid)]
        return 200, _page(items, r.query, s, "recurringRuns")  # the one camelCase field of v2beta1
    m = re.fullmatch(r"/apis/v2beta1/recurringruns/([^/:]+)", p)
    if r.method == "GET" and m:
        if m.group(1) not in s.recurring:
            raise ApiError(404, f"recurring run {m.group(1)!r} not found")
        return 200, s.recurring[m.group(1)]
    m = re.fullmatch(r"/apis/v2beta1/recurringruns/([^/:]+):disable", p)
    if r.method == "POST" and m:
        if m.group(1) not in s.recurring:
            raise ApiError(404, f"recurring run {m.group(1)!r} not found")
        s.recurring[m.group(1)].update(mode="DISABLE", status="DISABLED")
        return 200, {}
    raise ApiError(404, f"no route {r.method} {p}")


def _read_package(r: Request) -> dict:
    if not isinstance(r.body, dict) or not r.body.get("file"):
        raise ApiError(400, "no uploadfile in the request")
    docs = list(yaml.safe_load_all(r.body["file"]))
    if not docs or "pipelineInfo" not in (docs[0] or {}):
        raise ApiError(400, "the uploaded file is not a KFP pipeline spec")
    return {"pipeline_spec": docs[0], "platform_spec": docs[1] if len(docs) > 1 else None}


def _add_version(s: KFPState, pid: str, name: str, description: str, spec: dict) -> dict:
    vid = s.new_id("version")
    s.versions[vid] = {"pipeline_id": pid, "pipeline_version_id": vid, "display_name": name, "name": name,
                       "description": description, "created_at": CREATED, "_spec": spec}
    return s.versions[vid]


def _check_run_body(s: KFPState, body: dict) -> dict:
    """What the API server checks before it accepts a run or a recurring run."""
    if body.get("experiment_id") not in s.experiments:
        raise ApiError(404, f"experiment {body.get('experiment_id')!r} not found")
    ref = body.get("pipeline_version_reference") or {}
    version = s.versions.get(ref.get("pipeline_version_id"))
    if version is None or version["pipeline_id"] != ref.get("pipeline_id"):
        raise ApiError(404, f"pipeline version {ref!r} not found")
    declared = version["_spec"]["pipeline_spec"]["root"].get("inputDefinitions", {}).get("parameters", {})
    unknown = set((body.get("runtime_config") or {}).get("parameters") or {}) - set(declared)
    if unknown:
        raise ApiError(400, f"unknown runtime parameters {sorted(unknown)}")
    return body


class KFPServer:
    """`with KFPServer() as kfp: kfp.url, kfp.state` — a server on a free port of 127.0.0.1."""

    def __init__(self, state: KFPState | None = None):
        self.state = state or KFPState()
        handler = type("Handler", (_Handler,), {"state": self.state})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        # a short poll: shutdown() waits for it, once per server, in every test
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)

    def __enter__(self) -> KFPServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.state.released.set()
        self._server.shutdown()
        self._server.server_close()
