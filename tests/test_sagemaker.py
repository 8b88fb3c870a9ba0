"""SageMaker around a HyperPod run, through boto3 against moto's standalone server on 127.0.0.1:
the preflight (HyperPod cluster, instance group, healthy nodes) and model registration."""

from __future__ import annotations

from pathlib import Path

import pytest

from mazerl.cluster.sagemaker import PreflightError, RegistryError, preflight, register_model

IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/mazerl-serve@sha256:" + "0" * 64


def test_preflight_passes_with_enough_healthy_nodes(hyperpod):
    found = preflight("hp", "ml.p5.48xlarge", 2)
    assert found == {"cluster": "hp", "instance_groups": ["gpu"], "healthy_nodes": 2}


def test_preflight_names_what_is_missing(hyperpod):
    with pytest.raises(PreflightError, match="has 2 healthy ml.p5.48xlarge nodes; this job needs 3"):
        preflight("hp", "ml.p5.48xlarge", 3)
    with pytest.raises(PreflightError, match=r"no instance group of type ml.g5.48xlarge \(instance groups: gpu \(ml.p5.48xlarge\)\)"):
        preflight("hp", "ml.g5.48xlarge", 1)
    with pytest.raises(PreflightError, match="'nope'"):
        preflight("nope", "ml.p5.48xlarge", 1)


def test_promotion_registers_a_model_package_with_its_metrics(hyperpod):
    arn = register_model("mazerl-navigators", "s3://mazerl-test-bucket/registry/models/run-1", IMAGE,
                         {"heldout_success": 0.91, "success_diff": 0.12, "p_value": 0.001, "run_id": "run-1"},
                         "GRPO run run-1", metrics_uri="s3://mazerl-test-bucket/registry/models/run-1/comparison.json")
    second = register_model("mazerl-navigators", "s3://mazerl-test-bucket/registry/models/run-2", IMAGE,
                            {"heldout_success": 0.93}, "GRPO run run-2")
    assert arn.endswith("/mazerl-navigators/1") and second.endswith("/mazerl-navigators/2")
    described = hyperpod.describe_model_package(ModelPackageName=arn)
    assert described["CustomerMetadataProperties"]["heldout_success"] == "0.91"
    assert described["ModelApprovalStatus"] == "PendingManualApproval"
    source = described["InferenceSpecification"]["Containers"][0]["ModelDataSource"]["S3DataSource"]
    assert source["S3Uri"] == "s3://mazerl-test-bucket/registry/models/run-1/" and source["CompressionType"] == "None"


def test_a_model_not_on_s3_cannot_be_registered(hyperpod):
    with pytest.raises(RegistryError, match="not an s3:// address"):
        register_model("g", "/fsx/models/run-1", IMAGE, {}, "x")


def test_promote_on_a_hyperpod_profile_registers_the_model_package(hyperpod, tmp_path):
    """workflow.promote with a profile naming a model package group: the model is copied to the S3
    registry, the comparison written beside it, and a model package registered with its figures."""
    from mazerl.profiles import load_profile
    from mazerl.workflow import promote, read_registry

    model = tmp_path / "final"
    model.mkdir()
    (model / "config.json").write_text("{}")
    root = "s3://mazerl-test-bucket/registry-sm"
    comparison = {"decision": {"success_diff": 0.2, "p_value": 0.003},
                  "splits": {"heldout": {"mazes": 500, "success_base": 0.44, "success_new": 0.64, "mcnemar_p": 0.003},
                             "larger": {"mazes": 64, "success_base": 0.2, "success_new": 0.25, "mcnemar_p": 0.4}}}
    entry = promote(str(model), root, comparison, "hash9", "run-9",
                    profile_json=load_profile("hyperpod-p5").model_dump_json())
    assert read_registry(root)["model_package_arn"] == entry["model_package_arn"]
    described = hyperpod.describe_model_package(ModelPackageName=entry["model_package_arn"])
    assert described["ModelPackageGroupName"] == "mazerl-maze-navigators"
    assert described["CustomerMetadataProperties"]["success_diff"] == "0.2"
    assert described["CustomerMetadataProperties"]["run_id"] == "run-9"
    # every split's figures go with the package, and the whole comparison beside the model
    assert described["CustomerMetadataProperties"]["heldout/success_new"] == "0.64"
    assert described["CustomerMetadataProperties"]["larger/success_base"] == "0.2"
    from mazerl.storage import read_json

    assert read_json(f"{root}/models/run-9/comparison.json") == comparison
    assert described["ModelMetrics"]["ModelQuality"]["Statistics"]["S3Uri"] == f"{root}/models/run-9/comparison.json"


def test_promote_reads_compare_s_result_or_says_what_is_wrong(tmp_path):
    """The promote task gets compare's result folder; anything but a comparison with a decision is named."""
    import json

    from mazerl.config import ConfigError
    from mazerl.workflow import read_comparison

    with pytest.raises(ConfigError, match="cannot read the comparison .*comparison.json"):
        read_comparison(str(tmp_path))
    (tmp_path / "comparison.json").write_text(json.dumps({"splits": {}}))
    with pytest.raises(ConfigError, match="holds no promotion decision"):
        read_comparison(str(tmp_path))
    full = {"decision": {"success_diff": 0.1, "p_value": 0.01, "improved": True}, "splits": {"heldout": {"mazes": 5}}}
    (tmp_path / "comparison.json").write_text(json.dumps(full))
    assert read_comparison(str(tmp_path)) == full


def test_the_promote_component_records_compare_s_whole_result(tmp_path):
    """The KFP component itself: compare's result artifact in, the promotion recorded with it."""
    import json

    from kfp.dsl import Dataset

    from mazerl.components.promote import promote as promote_component
    from mazerl.workflow import read_registry

    model = tmp_path / "final"
    model.mkdir()
    (model / "config.json").write_text("{}")
    result = tmp_path / "result"
    result.mkdir()
    full = {"decision": {"success_diff": 0.12, "p_value": 0.004, "improved": True}, "splits": {"heldout": {"mazes": 500}}}
    (result / "comparison.json").write_text(json.dumps(full))
    root = str(tmp_path / "registry")
    where = promote_component(str(model), root, "hash3", Dataset(name="result", uri=str(result)), "run-3", "")
    entry = read_registry(root)
    assert entry["model"] == where and entry["decision"] == full["decision"] and (Path(where) / "config.json").is_file()
