"""Kubernetes RBAC for a cluster profile: what the pipeline's pods may do in the profile's namespace.

KFP's default `pipeline-runner` role cannot touch `ray.io` objects, so the training launcher
(backend `rayjob`) needs its own Role: create a RayJob, watch it to the end, read its pods' logs
for the failure report, and delete it on cancel (the ExitHandler's cleanup).
"""

from __future__ import annotations

import yaml

from .config import ConfigError
from .profiles import Profile, check_iam_role_arn

# (apiGroup, resources, verbs): exactly what the launcher (cluster/launcher.py: create, poll with get,
# cancel_run's list and delete) and a person reading the job's pods and logs need; nothing more
RULES: list[tuple[str, list[str], list[str]]] = [
    ("ray.io", ["rayjobs"], ["create", "get", "list", "delete"]),
    ("", ["pods", "pods/log"], ["get", "list"]),
]


def rbac_manifests(profile: Profile, iam_role_arn: str | None = None) -> list[dict]:
    """ServiceAccount (IRSA-annotated when a role ARN is given), Role and RoleBinding for `profile`."""
    if profile.kind != "hyperpod" or not profile.namespace or not profile.service_account:
        raise ValueError(f"profile {profile.name!r} is not a cluster profile: RBAC needs its namespace and service account")
    if iam_role_arn is not None:
        try:
            check_iam_role_arn(iam_role_arn)
        except ValueError as err:
            raise ConfigError(f"--iam-role-arn: {err}") from None
    ns, sa = profile.namespace, profile.service_account
    labels = {"app.kubernetes.io/part-of": "mazerl"}
    account: dict = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": ns, "labels": labels}}
    if iam_role_arn:  # S3 and SageMaker through IRSA: never keys in manifests
        account["metadata"]["annotations"] = {"eks.amazonaws.com/role-arn": iam_role_arn}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": f"{sa}-rayjobs", "namespace": ns, "labels": labels},
        "rules": [{"apiGroups": [g], "resources": r, "verbs": v} for g, r, v in RULES],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": f"{sa}-rayjobs", "namespace": ns, "labels": labels},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}],
    }
    return [account, role, binding]


def render(manifests: list[dict]) -> str:
    return yaml.safe_dump_all(manifests, sort_keys=False)
