"""Create a RayJob, follow it to the end, and clean it up: the train step's side of `backend: rayjob`.

The remote-runner pattern: create (or adopt the job a previous attempt of this task created: same
deterministic name, same KFP run label), poll `status.jobDeploymentStatus` until `Complete` or
`Failed`, report every status change with its reason, and delete the job when the task is cancelled.
The API server may go away for a while (an EKS control-plane update): polls are retried with backoff
for `api_outage_s` before the task gives up. Talks to Kubernetes through the official client, in the
cluster (the pod's service account) or with a kubeconfig.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import UserError
from .rayjob import API_VERSION, LABEL_RUN

GROUP, VERSION = API_VERSION.split("/")
PLURAL = "rayjobs"
# KubeRay's RayJob.status.jobDeploymentStatus values that end a job
TERMINAL = {"Complete", "Failed"}


class LauncherError(UserError):
    """The RayJob failed, or could not be created or followed; the message says why."""


class RBACError(LauncherError):
    """The service account may not do what the launcher needs (env/k8s RBAC)."""


@dataclass
class JobOutcome:
    name: str
    deployment_status: str
    job_status: str | None
    reason: str | None
    message: str | None
    dashboard_url: str | None
    history: list[str] = field(default_factory=list)  # every status change, in order

    @property
    def succeeded(self) -> bool:
        return self.deployment_status == "Complete" and self.job_status in (None, "SUCCEEDED")


def custom_objects_api(kubeconfig: str | None = None, host: str | None = None):
    """The CustomObjectsApi: in-cluster when running in a pod, else the kubeconfig (or a bare host)."""
    from kubernetes import client, config

    if host is not None:
        cfg = client.Configuration()
        cfg.host = host
        return client.CustomObjectsApi(client.ApiClient(cfg))
    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config(config_file=kubeconfig)
        except (config.ConfigException, FileNotFoundError, TypeError) as err:
            raise LauncherError(f"no Kubernetes credentials: not in a pod with a service account, and no usable "
                                f"kubeconfig ({err})") from None
    return client.CustomObjectsApi()


class RayJobLauncher:
    def __init__(self, api, namespace: str, poll_s: float = 10.0, api_outage_s: float = 300.0,
                 log: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.api, self.namespace = api, namespace
        self.poll_s, self.api_outage_s = poll_s, api_outage_s
        self.log, self.clock, self.sleep = log, clock, sleep

    # ---- create or adopt ---------------------------------------------------------------------------
    def submit(self, manifest: dict) -> str:
        """Create the RayJob; if this run's job of that name exists already (a retried task), adopt it."""
        from kubernetes.client.exceptions import ApiException

        name = manifest["metadata"]["name"]
        try:
            self._call(lambda: self.api.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, manifest),
                       f"create RayJob {name}")
            self.log(f"created RayJob {self.namespace}/{name}")
            return name
        except ApiException as err:
            if err.status != 409:
                raise
        existing = self._get(name)
        run = manifest["metadata"]["labels"].get(LABEL_RUN)
        theirs = (existing.get("metadata", {}).get("labels") or {}).get(LABEL_RUN)
        if theirs != run:
            raise LauncherError(f"RayJob {self.namespace}/{name} exists but belongs to KFP run {theirs!r}, not {run!r}: "
                                "refusing to adopt another run's job")
        status = existing.get("status") or {}
        if status.get("jobDeploymentStatus") == "Failed":
            # a retried task must retry: replace the failed job (the new one resumes from the last checkpoint)
            self.log(f"RayJob {self.namespace}/{name} of an earlier attempt failed ({status.get('reason') or '?'}: "
                     f"{status.get('message') or ''}); deleting it and starting again from the last checkpoint")
            self.cancel(name)
            self._wait_gone(name)
            self._call(lambda: self.api.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, manifest),
                       f"create RayJob {name}")
            self.log(f"created RayJob {self.namespace}/{name}")
            return name
        self.log(f"adopted RayJob {self.namespace}/{name} (created by an earlier attempt of this task)")
        return name

    def _wait_gone(self, name: str, timeout_s: float = 600.0) -> None:
        """Foreground deletion takes a while (the RayCluster and pods go first)."""
        from kubernetes.client.exceptions import ApiException

        started = self.clock()
        while self.clock() - started < timeout_s:
            try:
                self._call(lambda: self.api.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name),
                           f"read RayJob {name}")
            except ApiException as err:
                if err.status == 404:
                    return
                raise
            self.sleep(self.poll_s)
        raise LauncherError(f"RayJob {self.namespace}/{name} was not deleted within {timeout_s:g} s")

    # ---- follow ------------------------------------------------------------------------------------
    def wait(self, name: str, timeout_s: float | None = None) -> JobOutcome:
        """Poll until the job is Complete or Failed; every change of status is logged with its reason."""
        started = self.clock()
        last, history, dashboard = None, [], None
        while True:
            status = self._get(name).get("status") or {}
            state = (status.get("jobDeploymentStatus") or "New", status.get("jobStatus") or None,
                     status.get("reason") or None, status.get("message") or None)
            if state != last:
                line = f"RayJob {name}: {state[0]}" + (f", job {state[1]}" if state[1] else "") + \
                       (f" ({state[2]}: {state[3]})" if state[2] or state[3] else "")
                self.log(line)
                history.append(line)
                last = state
            url = status.get("dashboardURL")
            if url and url != dashboard:
                dashboard = url
                self.log(f"Ray dashboard: http://{url}" if "://" not in url else f"Ray dashboard: {url}")
            if state[0] in TERMINAL:
                return JobOutcome(name, state[0], state[1], state[2], state[3], dashboard, history)
            if timeout_s is not None and self.clock() - started > timeout_s:
                raise LauncherError(f"RayJob {name} did not finish within {timeout_s:g} s (last status {state[0]})")
            self.sleep(self.poll_s)

    def run(self, manifest: dict, timeout_s: float | None = None) -> JobOutcome:
        """Submit (or adopt), wait, and fail with the job's own reason if it did not succeed."""
        name = self.submit(manifest)
        outcome = self.wait(name, timeout_s)
        if not outcome.succeeded:
            why = ": ".join(x for x in (outcome.reason, outcome.message) if x) or f"job status {outcome.job_status}"
            raise LauncherError(f"RayJob {self.namespace}/{name} {outcome.deployment_status.lower()}: {why}")
        return outcome

    # ---- cancel ------------------------------------------------------------------------------------
    def cancel(self, name: str) -> bool:
        """Delete the RayJob and everything it owns (its RayCluster, pods); True if there was one."""
        from kubernetes.client.exceptions import ApiException

        try:
            self._call(lambda: self.api.delete_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name, propagation_policy="Foreground"), f"delete RayJob {name}")
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        self.log(f"deleted RayJob {self.namespace}/{name}")
        return True

    def cancel_run(self, run_id: str) -> list[str]:
        """Delete every RayJob of this KFP run that has not finished (the pipeline's exit handler: after a
        cancel or a failure nothing keeps running). Finished ones stay for KubeRay's TTL (their status)."""
        listed = self._call(lambda: self.api.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, label_selector=f"{LABEL_RUN}={run_id}"), "list RayJobs")
        running = [item["metadata"]["name"] for item in listed.get("items", [])
                   if (item.get("status") or {}).get("jobDeploymentStatus") not in TERMINAL]
        return [n for n in running if self.cancel(n)]

    # ---- the API, with retries ---------------------------------------------------------------------
    def _get(self, name: str) -> dict:
        from kubernetes.client.exceptions import ApiException

        try:
            return self._call(lambda: self.api.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name),
                              f"read RayJob {name}")
        except ApiException as err:
            if err.status == 404:
                raise LauncherError(f"RayJob {self.namespace}/{name} is gone (deleted outside this task?)") from None
            raise

    def _call(self, fn, what: str):
        """`fn()`, retried with backoff while the API server is unreachable or answers 5xx / 429, for up
        to `api_outage_s`; 403 becomes a clear RBAC error; other answers go to the caller."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError as Urllib3Error
        from urllib3.exceptions import MaxRetryError, SSLError

        first_failure, delay = None, 1.0
        while True:
            try:
                return fn()
            except ApiException as err:
                if err.status == 403:
                    raise RBACError(f"forbidden to {what} in namespace {self.namespace!r}: the pipeline's service account "
                                    "needs the Role in env/k8s (mazerl pipeline rbac --profile P)") from None
                if err.status == 401:
                    raise LauncherError(f"the Kubernetes API server rejected this task's credentials (401 Unauthorized) "
                                        f"trying to {what}: the service account token (or kubeconfig user) is missing, "
                                        "expired or for another cluster") from None
                if err.status is not None and err.status < 500 and err.status != 429:
                    raise
                problem = f"HTTP {err.status}"
            except (Urllib3Error, ConnectionError, OSError) as err:
                # a certificate the CA bundle does not vouch for will not get better by waiting
                cause = err.reason if isinstance(err, MaxRetryError) else err
                if isinstance(cause, SSLError) or "CERTIFICATE_VERIFY_FAILED" in str(cause):
                    raise LauncherError(f"TLS to the Kubernetes API server failed trying to {what}: {cause}; the CA "
                                        "bundle (in a pod: the service account's ca.crt) does not match the server") from None
                problem = type(err).__name__
            now = self.clock()
            first_failure = now if first_failure is None else first_failure
            if now - first_failure > self.api_outage_s:
                raise LauncherError(f"the Kubernetes API server did not answer for {self.api_outage_s:g} s "
                                    f"({problem} trying to {what})") from None
            self.log(f"Kubernetes API unavailable ({problem}); retrying in {delay:g} s")
            self.sleep(delay)
            delay = min(delay * 2, 15.0)
