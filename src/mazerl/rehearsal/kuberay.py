"""The rehearsal's KubeRay: runs a created RayJob's entrypoint on this machine, on a local Ray.

A real KubeRay starts the RayJob's Ray cluster (head and GPU workers, from the manifest) and submits the
entrypoint to it. Here the entrypoint runs as a process of this machine's Python (which must hold vLLM,
as the trainer image does), with the head container's environment, and with the only changes a
rehearsal allows appended as `--set` overrides (later ones win): the GPU sizing turned into CPU shares,
the device and dtypes, and counts. Deleting the RayJob (the launcher on SIGTERM, the exit handler)
stops the entrypoint and everything it started, as KubeRay deleting the Ray cluster would.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil


class LocalKubeRay:
    """`executor` and `on_delete` for kube_api.ClusterState."""

    def __init__(self, overrides: dict[str, object], workdir: Path, env: dict[str, str] | None = None,
                 timeout_s: float = 3600.0):
        self.overrides = overrides
        self.workdir = Path(workdir)
        self.env = env or {}
        self.timeout_s = timeout_s
        self.commands: list[list[str]] = []  # every entrypoint run, as run
        self._procs: dict[str, subprocess.Popen] = {}
        self._deleted: set[str] = set()
        self._lock = threading.Lock()

    def command(self, job: dict) -> list[str]:
        args = shlex.split(job["spec"]["entrypoint"])
        if args[:3] != ["python", "-m", "mazerl"]:
            raise ValueError(f"the RayJob's entrypoint is not `python -m mazerl ...`: {job['spec']['entrypoint']!r}")
        args = [sys.executable, *args[1:]]
        for key, value in self.overrides.items():
            args += ["--set", f"{key}={value}"]
        return args

    def __call__(self, job: dict) -> tuple[bool, str]:
        name = job["metadata"]["name"]
        head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
        env = {**os.environ, **{e["name"]: e["value"] for e in head.get("env", []) if "value" in e}, **self.env,
               "RAY_ADDRESS": ""}  # the entrypoint starts its own local Ray (KubeRay points it at the head)
        args = self.command(job)
        self.commands.append(args)
        log = self.workdir / f"{name}.entrypoint.log"
        with open(log, "w") as out, self._lock:
            proc = subprocess.Popen(args, cwd=self.workdir, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # its own process group: deleting the job stops all of it
            self._procs[name] = proc
        try:
            code = proc.wait(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            self.stop(name)
            code = proc.wait()
        tail = log.read_text(errors="replace")[-800:]
        if name in self._deleted:
            return False, "the RayJob was deleted; its entrypoint was stopped"
        return code == 0, f"entrypoint exited {code}: {tail}"

    def on_delete(self, job: dict) -> None:
        name = job["metadata"]["name"]
        self._deleted.add(name)
        self.stop(name)

    def stop(self, name: str) -> None:
        """Stop an entrypoint and every process it started (its Ray, rollout and rank actors)."""
        with self._lock:
            proc = self._procs.get(name)
        if proc is None or proc.poll() is not None:
            return
        stop_tree(proc.pid)

    def running(self) -> list[int]:
        """Processes of any entrypoint that are still alive (none, after every job ended or was deleted)."""
        alive = []
        for proc in self._procs.values():
            try:
                parent = psutil.Process(proc.pid)
                alive += [p.pid for p in [parent, *parent.children(recursive=True)] if p.is_running()
                          and p.status() != psutil.STATUS_ZOMBIE]
            except psutil.NoSuchProcess:
                pass
        return alive


def stop_tree(pid: int, grace_s: float = 20.0) -> None:
    """SIGTERM a process and its descendants, then SIGKILL whatever is left after `grace_s`."""
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    procs = [root, *root.children(recursive=True)]
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
