"""Create a RayJob, follow it to the end, and clean it up: the train step's side of `backend: rayjob`.

The remote-runner pattern: create (or adopt the job a previous attempt of this task created: same
deterministic name, same KFP run label), poll `status.jobDeploymentStatus` until the job ends, report
every status change with what it means, and delete the job when the task is stopped (SIGTERM, which is
all a terminated KFP run sends: its exit handler does not run) or the run is cleaned up. The deadline
counts from `status.startTime`, as KubeRay's `activeDeadlineSeconds` does; time queued in Kueue before
that is reported on its own. The API server may go away for a while (an EKS control-plane update):
polls are retried with backoff for `api_outage_s` before the task gives up. Talks to Kubernetes through
the official client, in the cluster (the pod's service account) or with a kubeconfig.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ..errors import Terminated, UserError, sigterm_as_interrupt
from .rayjob import API_VERSION, LABEL_RUN

GROUP, VERSION = API_VERSION.split("/")
PLURAL = "rayjobs"

# Every RayJob.status.jobDeploymentStatus of KubeRay v1 (ray-operator/apis/ray/v1/rayjob_types.go, 1.5 to
# 1.7) and what it means here; "" is KubeRay's New. Failed is final: a failure KubeRay will retry
# (spec.backoffLimit) is written as Retrying instead. ValidationFailed is final too, though KubeRay's
# IsJobDeploymentTerminal leaves it out: the operator rejected the spec and never reconciles the job again.
SUCCEEDED = "Complete"  # with status.jobStatus SUCCEEDED; another jobStatus (STOPPED, FAILED) is a failure
FAILED = {"Failed", "ValidationFailed"}
STARTED = {"Initializing", "Running", "Waiting"}  # counted from status.startTime: the deadline runs
NOT_STARTED = {"New", "Suspending", "Suspended", "Retrying"}  # queued, suspended or between attempts
MEANING = {
    "New": "not started: waiting for the KubeRay operator (and Kueue) to take it",
    "Initializing": "starting its Ray cluster (pods scheduled, images pulled); the deadline counts from its startTime",
    "Running": "the driver is running",
    "Waiting": "waiting for a job to be submitted to its Ray cluster",
    "Suspending": "Kueue suspended it (not admitted yet, or preempted): its Ray cluster is being deleted",
    "Suspended": "queued: waiting for Kueue to admit it; the deadline has not started",
    "Retrying": "the attempt failed; KubeRay starts another (spec.backoffLimit), from the last checkpoint",
    "Complete": "",  # the job's status and reason say it all
    "Failed": "",
    "ValidationFailed": "the KubeRay operator rejected the RayJob's spec and will not run it",
}
# finished jobs that KubeRay removes itself after spec.ttlSecondsAfterFinished; a ValidationFailed job is
# never reconciled again, so no TTL ever removes it
REMOVED_BY_TTL = {"Complete", "Failed"}
# seconds allowed for deleting the job once the task is told to stop: Kubernetes kills the pod 30 s after SIGTERM
STOP_API_WAIT_S = 20.0


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
    queued_s: float = 0.0  # seen not started (New, Suspending, Suspended, Retrying): Kueue's queue, preemptions
    started_at: str | None = None  # status.startTime of the last attempt: its deadline counts from here

    @property
    def succeeded(self) -> bool:
        return self.deployment_status == SUCCEEDED and self.job_status in (None, "SUCCEEDED")


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


def parse_time(value: str) -> float:
    """Seconds since the epoch of a Kubernetes timestamp (RFC 3339, e.g. 2026-12-04T12:00:00Z)."""
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    """SIGTERM and SIGINT ignored while the job is deleted: a second signal must not cut the cleanup short."""
    try:
        previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGTERM, signal.SIGINT)}
    except ValueError:  # not the main thread: signals go to the main thread only
        yield
        return
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)


class RayJobLauncher:
    def __init__(self, api, namespace: str, poll_s: float = 10.0, api_outage_s: float = 300.0,
                 log: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, wall_clock: Callable[[], float] = time.time,
                 queue_report_s: float = 900.0):
        """`wall_clock`: seconds since the epoch, to compare with the job's status.startTime (set by the
        operator's clock); `queue_report_s`: how often a job still queued is reported."""
        self.api, self.namespace = api, namespace
        self.poll_s, self.api_outage_s = poll_s, api_outage_s
        self.log, self.clock, self.sleep, self.wall_clock = log, clock, sleep, wall_clock
        self.queue_report_s = queue_report_s

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
        if status.get("jobDeploymentStatus") in FAILED:
            # a retried task must retry: replace the failed job (the new one resumes from the last checkpoint)
            self.log(f"RayJob {self.namespace}/{name} of an earlier attempt failed ({status.get('reason') or '?'}: "
                     f"{status.get('message') or ''}); deleting it and starting again from the last checkpoint")
            self.cancel(name)
            self._wait_gone(name)
            self._call(lambda: self.api.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, manifest),
                       f"create RayJob {name}")
            self.log(f"created RayJob {self.namespace}/{name}")
            return name
        owners = [o.get("name") for o in existing.get("metadata", {}).get("ownerReferences") or []]
        ours = [o.get("name") for o in manifest["metadata"].get("ownerReferences") or []]
        # the owner stays the earlier attempt's pod (changing it would need the patch verb, which the Role does not grant)
        owned = f"; owned by that attempt's pod {', '.join(owners)}, and deleted with it" if owners and owners != ours else ""
        self.log(f"adopted RayJob {self.namespace}/{name} (created by an earlier attempt of this task{owned})")
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
    def wait(self, name: str, deadline_s: float | None = None) -> JobOutcome:
        """Poll until the job ends (Complete, Failed, ValidationFailed); every change of status is logged
        with what it means, and time spent queued every `queue_report_s`. `deadline_s`: how long after
        its status.startTime (when KubeRay starts it, after any time queued) the job must have ended; past
        it, with the operator silent, the job is deleted and the task fails."""
        last, history, dashboard = None, [], None
        queued_s, queued_reported, polled = 0.0, 0.0, self.clock()
        while True:
            status = self._get(name).get("status") or {}
            now = self.clock()
            if last is not None and last[0] in NOT_STARTED:
                queued_s += now - polled
            polled = now
            state = (status.get("jobDeploymentStatus") or "New", status.get("jobStatus") or None,
                     status.get("reason") or None, status.get("message") or None)
            if state != last:
                line = f"RayJob {name}: {state[0]}" + (f", job {state[1]}" if state[1] else "") + \
                       (f" ({state[2]}: {state[3]})" if state[2] or state[3] else "")
                meaning = MEANING.get(state[0], "a status this version of mazerl does not know; waiting")
                self.log(f"{line}: {meaning}" if meaning else line)
                history.append(line)
                if state[0] in STARTED and (last is None or last[0] not in STARTED) and queued_s >= 60:
                    self.log(f"RayJob {name} started after {_minutes(queued_s)} queued")
                last = state
            url = status.get("dashboardURL")
            if url and url != dashboard:
                dashboard = url
                self.log(f"Ray dashboard: http://{url}" if "://" not in url else f"Ray dashboard: {url}")
            started_at = status.get("startTime") if state[0] in STARTED | {SUCCEEDED} | FAILED else None
            if state[0] == SUCCEEDED or state[0] in FAILED:
                if queued_s >= 60:
                    self.log(f"RayJob {name}: {_minutes(queued_s)} queued in all (Kueue, suspensions, retries)")
                return JobOutcome(name, state[0], state[1], state[2], state[3], dashboard, history, queued_s, started_at)
            if state[0] in NOT_STARTED and queued_s - queued_reported >= self.queue_report_s:
                queued_reported = queued_s
                self.log(f"RayJob {name}: queued for {_minutes(queued_s)} ({state[0]}); its deadline has not started")
            if deadline_s is not None and started_at and self.wall_clock() - parse_time(started_at) > deadline_s:
                self._delete_past_deadline(name, started_at, deadline_s)
            self.sleep(self.poll_s)

    def _delete_past_deadline(self, name: str, started_at: str, deadline_s: float) -> None:
        """KubeRay fails a job at its activeDeadlineSeconds; one still going well past it has an operator
        that is not acting (down, or not watching the namespace): free its GPUs and fail."""
        deleted = self.cancel(name)
        raise LauncherError(f"RayJob {self.namespace}/{name} started at {started_at} and has not ended "
                            f"{deadline_s:g} s later (its activeDeadlineSeconds and a margin): the KubeRay operator is "
                            f"not ending it; {'deleted it' if deleted else 'it is gone'}. Check the operator's logs")

    def run(self, manifest: dict, deadline_s: float | None = None) -> JobOutcome:
        """Submit (or adopt), wait, and fail with the job's own reason if it did not succeed. SIGTERM (KFP
        terminating the run) or SIGINT deletes the job, then ends the task with what was done."""
        name = manifest["metadata"]["name"]
        with sigterm_as_interrupt():
            try:
                self.submit(manifest)
                outcome = self.wait(name, deadline_s)
            except KeyboardInterrupt as stop:  # SIGINT, or SIGTERM as errors.Terminated
                signal_name = "SIGTERM" if isinstance(stop, Terminated) else "SIGINT"
                raise type(stop)(self._stop(name, manifest["metadata"]["labels"].get(LABEL_RUN), signal_name)) from None
        if not outcome.succeeded:
            why = ": ".join(x for x in (outcome.reason, outcome.message) if x) or f"job status {outcome.job_status}"
            what = "was rejected by the KubeRay operator" if outcome.deployment_status == "ValidationFailed" else \
                outcome.deployment_status.lower()
            raise LauncherError(f"RayJob {self.namespace}/{name} {what}: {why}")
        return outcome

    def _stop(self, name: str, run_id: str | None, signal_name: str) -> str:
        """Delete this run's job `name`, if there is one (the signal may have come before it was created),
        within the pod's grace period; returns (and logs) what was done."""
        from kubernetes.client.exceptions import ApiException

        patience, self.api_outage_s = self.api_outage_s, min(self.api_outage_s, STOP_API_WAIT_S)
        try:
            with _signals_ignored():
                try:
                    job = self._call(lambda: self.api.get_namespaced_custom_object(
                        GROUP, VERSION, self.namespace, PLURAL, name), f"read RayJob {name}")
                    theirs = (job.get("metadata", {}).get("labels") or {}).get(LABEL_RUN)
                    if theirs != run_id:
                        done = f"RayJob {self.namespace}/{name} belongs to KFP run {theirs!r}: left alone"
                    else:
                        self.cancel(name)
                        done = f"deleted RayJob {self.namespace}/{name} (its Ray cluster and pods go with it)"
                except ApiException as err:
                    if err.status != 404:
                        raise
                    done = f"no RayJob {self.namespace}/{name} had been created"
        except (LauncherError, ApiException) as err:
            done = (f"could not delete RayJob {self.namespace}/{name} ({err}); Kubernetes deletes it with this task's "
                    f"pod when it has that owner, else: kubectl delete rayjob -n {self.namespace} {name}")
        finally:
            self.api_outage_s = patience
        message = f"stopped by {signal_name}: {done}"
        self.log(message)
        return message

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
        cancel or a failure nothing keeps running). Finished ones stay for KubeRay's TTL (their status);
        a rejected (ValidationFailed) one goes, as no TTL would remove it."""
        listed = self._call(lambda: self.api.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, label_selector=f"{LABEL_RUN}={run_id}"), "list RayJobs")
        running = [item["metadata"]["name"] for item in listed.get("items", [])
                   if (item.get("status") or {}).get("jobDeploymentStatus") not in REMOVED_BY_TTL]
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
