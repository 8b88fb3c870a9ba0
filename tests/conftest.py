from __future__ import annotations

from pathlib import Path

import pytest

from mazerl.mazes.visgym import reference_file

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"
# VisGym's own recording (easy + hard, seeds 0-63) ships with the package; its first frames are test data.
FIXTURE = reference_file()
PNG_DIR = DATA / "visgym_png"


@pytest.fixture(scope="session")
def visgym_fixture() -> Path:
    assert FIXTURE.is_file(), f"the shipped VisGym reference file is missing: {FIXTURE}"
    return FIXTURE


@pytest.fixture(scope="session")
def visgym_png_dir() -> Path:
    assert PNG_DIR.is_dir(), f"VisGym frames missing: {PNG_DIR}"
    return PNG_DIR


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A freshly built tiny Qwen3-VL model directory (random weights)."""
    from mazerl.policy.tiny import init_tiny

    return init_tiny(tmp_path_factory.mktemp("models") / "tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_policy(tiny_model_dir):
    from mazerl.policy.chat import ChatFormat
    from mazerl.policy.loading import load_policy
    from mazerl.policy.prompts import SHORT_SYSTEM_PROMPT

    policy = load_policy(tiny_model_dir)
    return policy, ChatFormat(policy.processor, system_prompt=SHORT_SYSTEM_PROMPT)


@pytest.fixture(scope="session")
def small_mazes(tmp_path_factory) -> Path:
    """A small dataset (no reference splits) with 3x3- and 4x4-cell mazes."""
    from mazerl.mazes.splits import DatasetConfig, generate_dataset

    cfg = DatasetConfig.model_validate(
        {
            "reference_splits": {},
            "splits": {
                "heldout": {"count": 16, "max_turns": 18},
                "tiny": {"count": 16, "sizes": ["3x3"], "max_turns": 20},
                "train": {"count": 64},
            },
        }
    )
    out = tmp_path_factory.mktemp("data") / "mazes"
    generate_dataset(cfg, out)
    return out


# ---- moto's standalone S3/SageMaker server on 127.0.0.1 (boto3 talks to it over HTTP) ----------------
S3_TEST_BUCKET = "mazerl-test-bucket"


@pytest.fixture(scope="module")
def moto_url():
    from moto.server import ThreadedMotoServer

    from mazerl.distributed.group import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3(moto_url, monkeypatch):
    """Credentials and the endpoint from the environment only, as on a cluster (IRSA sets them there)."""
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)  # every AWS service (S3, SageMaker) at the local server
    client = boto3.client("s3")
    try:
        client.create_bucket(Bucket=S3_TEST_BUCKET)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=S3_TEST_BUCKET):
        for obj in page.get("Contents", []):
            client.delete_object(Bucket=S3_TEST_BUCKET, Key=obj["Key"])
    return client


@pytest.fixture
def hyperpod(s3):
    """A HyperPod cluster 'hp' with 2 ml.p5.48xlarge nodes (moto needs its lifecycle bucket to exist)."""
    import boto3

    s3.create_bucket(Bucket="sagemaker-lifecycle-mazerl")
    sm = boto3.client("sagemaker")
    try:
        sm.delete_cluster(ClusterName="hp")
    except sm.exceptions.ClientError:
        pass
    sm.create_cluster(ClusterName="hp", Orchestrator={"Eks": {"ClusterArn": "arn:aws:eks:us-east-1:123456789012:cluster/eks"}},
                      InstanceGroups=[{"InstanceGroupName": "gpu", "InstanceType": "ml.p5.48xlarge", "InstanceCount": 2,
                                       "ThreadsPerCore": 1, "ExecutionRole": "arn:aws:iam::123456789012:role/hp",
                                       "LifeCycleConfig": {"SourceS3Uri": "s3://sagemaker-lifecycle-mazerl/lc", "OnCreate": "on_create.sh"}}])
    return sm


def assert_clear_error(result, *fragments, code=2):
    """A CLI result that is one clear message: exit `code`, the fragments in it, no traceback or internal error."""
    text = result.output
    assert result.exit_code == code, text
    assert "Traceback" not in text and "internal error" not in text, text
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "error" in text.lower(), text
    for f in fragments:
        assert f.lower() in " ".join(text.lower().split()), (f, text)


def lora_model(model_dir):
    """The model of `model_dir` with LoRA adapters (r 4) whose B matrices are not zero (they start at 0:
    this gives the adapters something to merge). Returns (peft model, LoraSettings)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from mazerl.policy.config import LoraSettings
    from mazerl.policy.loading import load_policy

    lora = LoraSettings(r=4, alpha=8)
    model = get_peft_model(load_policy(model_dir).model,
                           LoraConfig(r=lora.r, lora_alpha=lora.alpha, target_modules=lora.target_modules))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    return model, lora
