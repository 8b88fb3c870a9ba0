"""SageMaker calls around a HyperPod run, through boto3: the preflight before a RayJob is launched
(does the HyperPod cluster have enough healthy nodes of the profile's instance type?) and the model
registration after a promotion (a model package in a Model Registry group, with the evaluation's
figures attached). Credentials come from the environment (IRSA on the cluster)."""

from __future__ import annotations

from ..errors import UserError

HEALTHY = "Running"  # ClusterInstanceStatus of a node that can take work


class PreflightError(UserError):
    """The HyperPod cluster cannot run this job as sized; the message says what it has."""


class RegistryError(UserError):
    """SageMaker refused to register the model."""


def sagemaker_client(region: str | None = None):
    import boto3

    return boto3.client("sagemaker", region_name=region) if region else boto3.client("sagemaker")


def preflight(cluster_name: str, instance_type: str, nodes_needed: int, client=None) -> dict:
    """Check the HyperPod cluster before launching: InService, with >= `nodes_needed` healthy nodes
    of `instance_type`. Returns what was found (for the task log)."""
    from botocore.exceptions import BotoCoreError, ClientError

    client = client or sagemaker_client()
    try:
        cluster = client.describe_cluster(ClusterName=cluster_name)
        nodes = []
        kwargs: dict = {"ClusterName": cluster_name}
        while True:
            page = client.list_cluster_nodes(**kwargs)
            nodes += page.get("ClusterNodeSummaries", [])
            if not page.get("NextToken"):
                break
            kwargs["NextToken"] = page["NextToken"]
    except ClientError as err:
        e = err.response.get("Error", {})
        raise PreflightError(f"HyperPod cluster {cluster_name!r}: {e.get('Code')}: {e.get('Message')}") from None
    except BotoCoreError as err:
        raise PreflightError(f"cannot reach SageMaker to check HyperPod cluster {cluster_name!r}: {err}") from None
    status = cluster.get("ClusterStatus")
    if status != "InService":
        raise PreflightError(f"HyperPod cluster {cluster_name!r} is {status}, not InService")
    groups = {g["InstanceGroupName"]: g["InstanceType"] for g in cluster.get("InstanceGroups", [])}
    matching = [name for name, kind in groups.items() if kind == instance_type]
    if not matching:
        have = ", ".join(f"{n} ({k})" for n, k in sorted(groups.items())) or "none"
        raise PreflightError(f"HyperPod cluster {cluster_name!r} has no instance group of type {instance_type} "
                             f"(instance groups: {have})")
    healthy = [n for n in nodes if n.get("InstanceType") == instance_type
               and (n.get("InstanceStatus") or {}).get("Status") == HEALTHY]
    if len(healthy) < nodes_needed:
        unhealthy = sorted({(n.get("InstanceStatus") or {}).get("Status", "?") for n in nodes
                            if n.get("InstanceType") == instance_type} - {HEALTHY})
        raise PreflightError(f"HyperPod cluster {cluster_name!r} has {len(healthy)} healthy {instance_type} nodes; this "
                             f"job needs {nodes_needed}" + (f" (others are {', '.join(unhealthy)})" if unhealthy else ""))
    return {"cluster": cluster_name, "instance_groups": matching, "healthy_nodes": len(healthy)}


def register_model(group: str, model_uri: str, image: str, metrics: dict[str, float | str], description: str,
                   approval: str = "PendingManualApproval", metrics_uri: str | None = None, client=None,
                   model_card: str | None = None, card_status: str = "Draft") -> str:
    """A new model package version in `group` (created if missing) for the model files under
    `model_uri` (an s3:// prefix, uncompressed), served by `image`; `metrics` go in as customer
    metadata, `metrics_uri` (the comparison JSON on S3) as its model-quality statistics, `model_card`
    (JSON in the model package model card schema: model_card.sagemaker_card_content) as the package's
    model card with status `card_status`. Returns the model package ARN."""
    from botocore.exceptions import BotoCoreError, ClientError

    if not model_uri.startswith("s3://"):
        raise RegistryError(f"SageMaker registers models on S3; {model_uri!r} is not an s3:// address "
                            "(set the profile's storage.root to s3://...)")
    client = client or sagemaker_client()
    try:
        try:
            client.describe_model_package_group(ModelPackageGroupName=group)
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") not in ("ValidationException", "ResourceNotFound"):
                raise
            client.create_model_package_group(ModelPackageGroupName=group,
                                              ModelPackageGroupDescription="mazerl: maze-navigating vision-language models")
        request = {
            "ModelPackageGroupName": group,
            "ModelPackageDescription": description[:1024],
            "InferenceSpecification": {
                "Containers": [{"Image": image, "ModelDataSource": {"S3DataSource": {
                    "S3Uri": model_uri.rstrip("/") + "/", "S3DataType": "S3Prefix", "CompressionType": "None"}}}],
                "SupportedContentTypes": ["application/json"],
                "SupportedResponseMIMETypes": ["application/json"],
            },
            "ModelApprovalStatus": approval,
            # 50 entries at most, values strings of <= 256 characters
            "CustomerMetadataProperties": {str(k)[:128]: str(v)[:256] for k, v in list(metrics.items())[:50]},
        }
        if model_card:
            request["ModelCard"] = {"ModelCardContent": model_card, "ModelCardStatus": card_status}
        if metrics_uri:
            request["ModelMetrics"] = {"ModelQuality": {"Statistics": {"ContentType": "application/json", "S3Uri": metrics_uri}}}
        return client.create_model_package(**request)["ModelPackageArn"]
    except ClientError as err:
        e = err.response.get("Error", {})
        raise RegistryError(f"SageMaker refused to register the model in {group!r}: {e.get('Code')}: {e.get('Message')}") from None
    except BotoCoreError as err:
        raise RegistryError(f"cannot reach SageMaker to register the model: {err}") from None
