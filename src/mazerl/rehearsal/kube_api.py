"""A Kubernetes API server on 127.0.0.1 for the custom-objects endpoints the RayJob launcher uses
(the rehearsal's cluster, and the tests').

It speaks the real wire format (`/apis/ray.io/v1/namespaces/<ns>/rayjobs[/<name>]`, JSON bodies,
`Status` objects with `reason` and `code` on errors), keeps RayJobs in memory, and plays KubeRay's
part: each GET advances a job along a scripted list of statuses, with KubeRay's status.startTime (set
each time the job starts Initializing, kept while it is suspended) and endTime. Scenarios switch on what a real
cluster does: 403 for a service account without the Role, 409 for a name that exists, an outage
(connections refused) for a set number of seconds mid-poll, and, as in a pod, HTTPS with a
certificate of its own CA (`self_signed_certificate`) and 401 for a request without the service
account's bearer token. With `validate=True` a created RayJob is checked against KubeRay's CRD schema
(ray.io/v1, shipped with the package) and refused with 422 Invalid, as a real API server does.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import re
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from mazerl.distributed.group import free_port

_PATH = re.compile(r"^/apis/ray\.io/v1/namespaces/(?P<ns>[^/]+)/rayjobs(?:/(?P<name>[^/]+))?$")


@dataclass
class ClusterState:
    jobs: dict[tuple[str, str], dict] = field(default_factory=dict)
    # statuses each job passes through, one per GET (the last one stays)
    script: list[dict] = field(default_factory=lambda: [
        {"jobDeploymentStatus": "Initializing"},
        {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "dashboardURL": "mazerl-head-svc.ns.svc.cluster.local:8265"},
        {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}])
    forbidden: set[str] = field(default_factory=set)  # verbs answered with 403 (create, get, delete, list)
    outage_after_gets: int | None = None  # refuse connections after this many GETs ...
    outage_s: float = 0.0  # ... for this long
    requests: list[tuple[str, str]] = field(default_factory=list)
    bearer_token: str | None = None  # when set, a request must carry "Authorization: Bearer <it>" (else 401)
    # when set, plays the job for real: called with the created RayJob in a thread; returns (ok, message).
    # Until it returns the job is Running; then Complete/SUCCEEDED or Failed/AppFailed with the message.
    executor: object = None
    # when set, called with a RayJob as it is deleted (KubeRay then deletes its Ray cluster: the rehearsal
    # stops the entrypoint it runs)
    on_delete: Callable[[dict], None] | None = None
    validate: bool = False  # check created RayJobs against the CRD's schema (422 Invalid when they do not match)
    created: list[dict] = field(default_factory=list)  # every RayJob accepted, as the client sent it
    now: Callable[[], float] = time.time  # the operator's clock, for startTime and endTime
    _runs: dict = field(default_factory=dict)
    _gets: int = 0
    _progress: dict[tuple[str, str], int] = field(default_factory=dict)


_FINAL = ("Complete", "Failed", "ValidationFailed")  # KubeRay never changes these again


def rayjob_schema() -> dict:
    """KubeRay's RayJob CRD schema (ray.io/v1 openAPIV3Schema), shipped as package data."""
    import gzip
    from importlib.resources import files

    raw = files("mazerl").joinpath("assets/crds/rayjob-v1.schema.json.gz").read_bytes()
    return json.loads(gzip.decompress(raw))


def rayjob_schema_errors(manifest: dict) -> list[str]:
    """Where `manifest` breaks the CRD's schema (empty when it is valid)."""
    import jsonschema

    return [f"{e.json_path}: {e.message}" for e in jsonschema.Draft7Validator(rayjob_schema()).iter_errors(manifest)]


def _timestamp(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _with_times(old: dict, new: dict, now: float) -> dict:
    """KubeRay's timestamps on a scripted status: startTime set when the job starts Initializing (its
    first start, after a Kueue admission, after a retry), else kept (a suspended job keeps its last);
    endTime when it ends. A script that gives them keeps its own."""
    if "startTime" not in new:
        if new.get("jobDeploymentStatus") == "Initializing" and old.get("jobDeploymentStatus") != "Initializing":
            new["startTime"] = _timestamp(now)
        elif "startTime" in old:
            new["startTime"] = old["startTime"]
    if new.get("jobDeploymentStatus") in ("Complete", "Failed") and "endTime" not in new:
        new["endTime"] = _timestamp(now)
    return new


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


class _Handler(BaseHTTPRequestHandler):
    state: ClusterState
    server_ref: "K8sAPIServer"

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self, verb: str):
        url = urlsplit(self.path)
        m = _PATH.match(url.path)
        self.state.requests.append((verb, url.path))
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        if self.state.bearer_token is not None and (scheme.lower() != "bearer" or token != self.state.bearer_token):
            self._send(401, _status(401, "Unauthorized", "Unauthorized"))
            return None
        if m is None:
            self._send(404, _status(404, "NotFound", f"the server could not find the requested resource {url.path}"))
            return None
        if verb in self.state.forbidden:
            self._send(403, _status(403, "Forbidden", f'rayjobs.ray.io is forbidden: User "system:serviceaccount:'
                                    f'{m["ns"]}:pipeline-runner" cannot {verb} resource "rayjobs"'))
            return None
        return m, parse_qs(url.query)

    def do_POST(self) -> None:
        routed = self._route("create")
        if routed is None:
            return
        m, _ = routed
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.state.validate and (problems := rayjob_schema_errors(body)):
            self._send(422, _status(422, "Invalid", "RayJob.ray.io is invalid: " + "; ".join(problems[:5])))
            return
        name = body["metadata"]["name"]
        key = (m["ns"], name)
        if key in self.state.jobs:
            self._send(409, _status(409, "AlreadyExists", f'rayjobs.ray.io "{name}" already exists'))
            return
        self.state.created.append(json.loads(json.dumps(body)))
        body["metadata"].update(namespace=m["ns"], uid=f"uid-{len(self.state.jobs) + 1}", resourceVersion="1",
                                creationTimestamp="2026-11-30T12:00:00Z")
        self.state.jobs[key] = body
        if self.state.executor is not None:
            result: dict = {}
            worker = threading.Thread(target=lambda: result.update(outcome=self.state.executor(body)), daemon=True)
            self.state._runs[key] = (worker, result)
            worker.start()
        self._send(201, body)

    def do_GET(self) -> None:
        routed = self._route("get")
        if routed is None:
            return
        m, query = routed
        if m["name"] is None:  # list, by label selector
            selector = dict(kv.split("=", 1) for kv in query.get("labelSelector", [""])[0].split(",") if kv)
            items = [j for (ns, _), j in self.state.jobs.items() if ns == m["ns"]
                     and all((j["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items())]
            self._send(200, {"apiVersion": "ray.io/v1", "kind": "RayJobList", "metadata": {}, "items": items})
            return
        key = (m["ns"], m["name"])
        job = self.state.jobs.get(key)
        if job is None:
            self._send(404, _status(404, "NotFound", f'rayjobs.ray.io "{m["name"]}" not found'))
            return
        self.state._gets += 1
        if key in self.state._runs:
            worker, result = self.state._runs[key]
            if worker.is_alive():
                job["status"] = {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}
            else:
                ok, message = result.get("outcome", (False, "the executor raised"))
                job["status"] = ({"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"} if ok else
                                 {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "reason": "AppFailed", "message": message})
        elif (job.get("status") or {}).get("jobDeploymentStatus") in _FINAL:
            pass
        else:
            step = self.state._progress.get(key, 0)
            job["status"] = _with_times(job.get("status") or {}, dict(self.state.script[min(step, len(self.state.script) - 1)]),
                                        self.state.now())
            self.state._progress[key] = step + 1
        self._send(200, job)
        if self.state.outage_after_gets is not None and self.state._gets == self.state.outage_after_gets:
            self.server_ref.go_away(self.state.outage_s)

    def do_DELETE(self) -> None:
        routed = self._route("delete")
        if routed is None:
            return
        m, _ = routed
        job = self.state.jobs.pop((m["ns"], m["name"]), None)
        self.state._progress.pop((m["ns"], m["name"]), None)  # a new job of that name starts its script over
        if job is None:
            self._send(404, _status(404, "NotFound", f'rayjobs.ray.io "{m["name"]}" not found'))
            return
        if self.state.on_delete is not None:
            self.state.on_delete(job)
        self._send(200, _status(200, "", "") | {"status": "Success"})


class K8sAPIServer:
    """`with K8sAPIServer() as srv:` ... `srv.url`, `srv.state`."""

    def __init__(self, state: ClusterState | None = None, tls: tuple[str, str] | None = None):
        """`tls`: (certificate, key) PEM files; the server then speaks HTTPS only."""
        self.state = state or ClusterState()
        self.port = free_port()
        self.tls = tls
        self._server = None
        self._thread = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def start(self) -> None:
        handler = type("Handler", (_Handler,), {"state": self.state, "server_ref": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        if self.tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self.tls)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def go_away(self, seconds: float) -> None:
        """Stop listening (connections refused) and come back on the same port after `seconds`."""

        def outage() -> None:
            self.stop()
            time.sleep(seconds)
            self.start()

        threading.Thread(target=outage, daemon=True).start()

    def __enter__(self) -> "K8sAPIServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def write_kubeconfig(path, server: str, token: str, namespace: str | None = None, name: str = "local") -> None:
    """A kubeconfig whose current context reaches `server` with a bearer `token` (as the launcher reads one
    outside a pod)."""
    from pathlib import Path

    import yaml

    context = {"cluster": name, "user": name, **({"namespace": namespace} if namespace else {})}
    Path(path).write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [{"name": name, "cluster": {"server": server}}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": context}]}))


def self_signed_certificate(directory, name: str = "apiserver") -> tuple[str, str]:
    """A CA-less self-signed certificate for 127.0.0.1 (it is its own CA bundle): (cert, key) paths."""
    from pathlib import Path

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    directory = Path(directory)
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)
