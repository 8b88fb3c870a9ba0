"""The rehearsal's AWS: moto's server on 127.0.0.1 playing S3 and SageMaker under the profile's own names.

The profile's bucket, its HyperPod cluster (InService, with the RayJob's worker count of healthy nodes of
the profile's instance type) exist there as they do in the account the profile was written for, so the
storage root, the preflight and the model registration run with the shipped values.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

from ..errors import UserError
from ..profiles import INSTANCE_TYPE_LABEL, Profile

REGION = "us-west-2"
ENV = {"AWS_ACCESS_KEY_ID": "rehearsal", "AWS_SECRET_ACCESS_KEY": "rehearsal", "AWS_DEFAULT_REGION": REGION}


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """These environment variables set for the block (the tasks kfp.local starts inherit them), then
    each restored to what it was."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _bucket(root: str) -> str | None:
    return root[len("s3://"):].split("/", 1)[0] if root.startswith("s3://") else None


@contextmanager
def local_aws(profile: Profile) -> Iterator[dict[str, str]]:
    """Start moto's server with the profile's bucket and HyperPod cluster; yields the environment that
    points boto3 at it (every AWS service at one endpoint, as AWS_ENDPOINT_URL does)."""
    try:
        import boto3
        from moto.server import ThreadedMotoServer
    except ImportError:
        raise UserError("the rehearsal plays S3 and SageMaker with moto's server: pip install 'mazerl[rehearse]'") from None
    import logging

    from ..distributed.group import free_port

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {**ENV, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    try:
        with environment(env):
            s3 = boto3.client("s3", region_name=REGION)
            for bucket in {b for b in (_bucket(profile.storage.root), "sagemaker-mazerl-rehearsal-lifecycle") if b}:
                s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
            if profile.sagemaker is not None and profile.sagemaker.cluster_name:
                workers = profile.rayjob.workers if profile.rayjob is not None else 1
                boto3.client("sagemaker", region_name=REGION).create_cluster(
                    ClusterName=profile.sagemaker.cluster_name,
                    Orchestrator={"Eks": {"ClusterArn": f"arn:aws:eks:{REGION}:123456789012:cluster/rehearsal"}},
                    InstanceGroups=[{"InstanceGroupName": "gpu", "InstanceType": profile.node_selector[INSTANCE_TYPE_LABEL],
                                     "InstanceCount": workers, "ThreadsPerCore": 1,
                                     "ExecutionRole": "arn:aws:iam::123456789012:role/rehearsal",
                                     "LifeCycleConfig": {"SourceS3Uri": "s3://sagemaker-mazerl-rehearsal-lifecycle/lc",
                                                         "OnCreate": "on_create.sh"}}])
            yield env
    finally:
        server.stop()


def registered_models(group: str) -> list[dict]:
    """The model packages SageMaker's registry holds in `group` (none when the group does not exist)."""
    import boto3

    client = boto3.client("sagemaker", region_name=REGION)
    try:
        return client.list_model_packages(ModelPackageGroupName=group).get("ModelPackageSummaryList", [])
    except client.exceptions.ClientError:
        return []
