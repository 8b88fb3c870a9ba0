"""A card for every promoted model (issue #35 §3): README.md in the promoted model's directory, a Hugging
Face model card (front matter with one model-index result per evaluated split and its 95% interval) over
the run card; on the local and S3 registries, and with the SageMaker model package. And the dependencies
as the design names them (§4): kubernetes declared, the unused sagemaker SDK gone from the images."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from conftest import S3_TEST_BUCKET
from mazerl.evaluation.stats import wilson_interval
from mazerl.model_card import (CARD_FILE, ModelCardError, read_front_matter, render_card, reproduce_command,
                               sagemaker_card_content)
from mazerl.profiles import load_profile

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def comparison_dir(small_mazes, tmp_path_factory) -> Path:
    """compare's real output: a random baseline against the oracle on two splits, guards on."""
    from mazerl.evaluation.runner import EvalConfig, evaluate
    from mazerl.workflow import compare

    out = tmp_path_factory.mktemp("card-evals")
    data = [str(small_mazes / "heldout.parquet"), str(small_mazes / "tiny.parquet")]
    evaluate(EvalConfig(policy="random", data=data, out=str(out / "random")))
    evaluate(EvalConfig(policy="oracle", data=data, out=str(out / "oracle")))
    compare(str(out / "random"), str(out / "oracle"), str(out / "cmp"), 0.0, 0.05)
    return out / "cmp"


@pytest.fixture
def comparison(comparison_dir) -> dict:
    from mazerl.workflow import read_comparison

    return read_comparison(str(comparison_dir))


def _run(small_mazes) -> dict:
    """The facts the pipeline's promote step passes (see components/promote.py)."""
    return {"parameters": {"model": "tiny-base", "model_view": "", "dataset_preset": "smoke", "reference": "none",
                           "warm_start": False, "sft_config": "", "grpo_config": "tiny-grpo", "sft_steps": 0, "grpo_steps": 2,
                           "heldout_mazes": 16, "other_mazes": 4, "reference_mazes": 0},
            "base_model": "tiny-base", "train_seed": 1234, "data_dir": str(small_mazes)}


def _model(tmp_path: Path) -> Path:
    model = tmp_path / "task-output" / "final"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"a": 1}')
    (model / "model.safetensors").write_bytes(b"weights")
    return model


def _check_card(card: str, comparison: dict, base_model: bool = True) -> dict:
    """The front matter parses; per split its numbers are comparison.json's, with the 95% intervals."""
    meta = read_front_matter(card)
    assert meta["library_name"] == "transformers" and "mazerl" in meta["tags"] and bool(meta.get("base_model")) == base_model
    (entry,) = meta["model-index"]
    results = {r["dataset"]["split"]: r for r in entry["results"]}
    assert set(results) == set(comparison["splits"])  # one result per evaluated split
    for split, fig in comparison["splits"].items():
        r = results[split]
        assert r["task"]["type"] and r["task"]["name"] and r["dataset"]["type"] and r["dataset"]["name"]
        m = {x["type"]: x["value"] for x in r["metrics"]}
        assert m["success_rate"] == fig["success_new"] and m["baseline_success_rate"] == fig["success_base"]
        assert m["success_rate_gain"] == fig["success_diff"] and m["mcnemar_p_value"] == fig["mcnemar_p"]
        assert [m["success_rate_gain_ci95_low"], m["success_rate_gain_ci95_high"]] == fig["success_diff_ci95"]
        low, high = wilson_interval(round(fig["success_new"] * fig["mazes"]), fig["mazes"])
        assert (m["success_rate_ci95_low"], m["success_rate_ci95_high"]) == (low, high)
        assert low <= m["success_rate"] <= high and r["dataset"]["args"]["mazes"] == fig["mazes"]
    return meta


def test_the_card_s_front_matter_parses_and_its_numbers_are_comparison_json_s(comparison, small_mazes, tmp_path):
    from mazerl.workflow import run_facts

    facts = run_facts("run-7", str(tmp_path / "registry"), comparison_hash := "e" * 64,
                      load_profile("local").model_dump_json(), _run(small_mazes))
    card = render_card(comparison, facts)
    meta = _check_card(card, comparison)
    assert meta["base_model"] == "tiny-base" and meta["model-index"][0]["name"] == "mazerl-run-7"
    manifest = json.loads((small_mazes / "manifest.json").read_text())
    revisions = {r["dataset"]["split"]: r["dataset"]["revision"] for r in meta["model-index"][0]["results"]}
    assert revisions == {s: manifest["splits"][s]["content_hash"] for s in comparison["splits"]}
    body = card.split("\n---\n", 1)[1]
    # the run card: run id, seed, dataset and evaluation-split hashes, code version, job config, base model
    for fact in ("run-7", "1234", manifest["splits"]["train"]["content_hash"], comparison_hash, "mazerl 0.1.0",
                 "grpo_config tiny-grpo", "no warm start", "tiny-base"):
        assert fact in body, fact
    # the comparison with its guards: every guard by name, the decision's rule
    assert all(f"| {g['name']} |" in body for g in comparison["guards"])
    assert f"gain > {comparison['decision']['min_gain']} and p <= {comparison['decision']['max_p_value']}" in body


def test_the_reproduce_command_is_one_the_pipeline_accepts(comparison, small_mazes, tmp_path):
    """Every --param of the card's command is a parameter of the local profile's pipeline, of the right type;
    the drawn seed and compare's rule and guards are in it, and it writes to a registry of its own."""
    from mazerl.config import parse_overrides
    from mazerl.pipelines.run import check_arguments
    from mazerl.workflow import run_facts

    profile = load_profile("local")
    facts = run_facts("run-7", str(tmp_path / "registry"), "h", profile.model_dump_json(), _run(small_mazes))
    words = shlex.split(reproduce_command(facts, comparison))
    assert words[:5] == ["mazerl", "pipeline", "run", "--profile", "local"]
    params = parse_overrides([words[i + 1] for i, w in enumerate(words) if w == "--param"])
    checked = check_arguments(profile, params)
    assert checked["train_seed"] == 1234 and checked["grpo_config"] == "tiny-grpo"
    assert checked["min_gain"] == comparison["decision"]["min_gain"] and checked["guards"] is True
    assert checked["registry_root"] == str(tmp_path / "registry" / "reproductions" / "run-7")
    hyperpod = load_profile("hyperpod-p5")
    cluster = run_facts("run-7", "s3://b/registry", "h", hyperpod.model_dump_json(), _run(small_mazes))
    assert reproduce_command(cluster, comparison).startswith("mazerl pipeline submit --profile hyperpod-p5 ")


def test_a_run_that_started_from_the_promoted_model_is_reproduced_from_that_model(comparison, small_mazes, tmp_path):
    from mazerl.workflow import run_facts

    run = {**_run(small_mazes), "base_model": "/registry/models/run-6"}
    facts = run_facts("run-7", str(tmp_path / "r"), "h", load_profile("local").model_dump_json(), run,
                      previous={"model": "/registry/models/run-6", "run_id": "run-6"})
    assert "--param model=/registry/models/run-6" in reproduce_command(facts, comparison)


def test_a_local_registry_promotion_writes_the_card_into_the_model_s_directory(comparison, small_mazes, tmp_path):
    from mazerl.workflow import promote, read_registry

    root = str(tmp_path / "registry")
    entry = promote(str(_model(tmp_path)), root, comparison, "hash1", "run-1",
                    profile_json=load_profile("local").model_dump_json(), run=_run(small_mazes))
    card = Path(entry["model"]) / CARD_FILE
    assert card.is_file() and read_registry(root)["model_card"] == str(card)
    assert (Path(entry["model"]) / "model.safetensors").read_bytes() == b"weights"
    _check_card(card.read_text(), comparison)
    # a promotion outside the pipeline (no run facts) still gets its card, saying what was not recorded
    second = promote(entry["model"], root, comparison, "hash1", "run-2")
    bare = (Path(second["model"]) / CARD_FILE).read_text()
    _check_card(bare, comparison, base_model=False)
    assert "were not recorded" in bare and "run-2" in bare


def test_an_s3_registry_promotion_writes_the_card_next_to_the_model(s3, comparison, small_mazes, tmp_path):
    from mazerl.storage import read_json
    from mazerl.workflow import promote, read_registry

    root = f"s3://{S3_TEST_BUCKET}/registry"
    entry = promote(str(_model(tmp_path)), root, comparison, "hash1", "run-1",
                    profile_json=load_profile("local").model_dump_json(), run=_run(small_mazes))
    key = "registry/models/run-1/README.md"
    assert entry["model_card"] == f"s3://{S3_TEST_BUCKET}/{key}" == read_registry(root)["model_card"]
    obj = s3.get_object(Bucket=S3_TEST_BUCKET, Key=key)
    assert obj["ContentType"] == "text/markdown"
    _check_card(obj["Body"].read().decode(), comparison)
    assert read_json(f"{root}/models/run-1/manifest.json")  # the model itself, complete, beside it


def test_the_sagemaker_model_package_carries_the_card(hyperpod, comparison, small_mazes, tmp_path, monkeypatch):
    """CreateModelPackage gets ModelCard (the model package card schema: evaluation_details with the same
    figures, the run in additional_information); botocore validates the request and moto's server accepts it,
    but moto does not keep ModelCard, so the request is read as sent. The package's metadata names the
    README beside the model on S3."""
    import boto3

    from mazerl.cluster import sagemaker
    from mazerl.workflow import promote

    sent: list[dict] = []

    def client(region=None):
        sm = boto3.client("sagemaker")
        sm.meta.events.register("provide-client-params.sagemaker.CreateModelPackage", lambda params, **_: sent.append(params))
        return sm

    monkeypatch.setattr(sagemaker, "sagemaker_client", client)
    root = f"s3://{S3_TEST_BUCKET}/registry-sm"
    entry = promote(str(_model(tmp_path)), root, comparison, "hash9", "run-9",
                    profile_json=load_profile("hyperpod-p5").model_dump_json(), run=_run(small_mazes))
    (request,) = sent
    assert request["ModelCard"]["ModelCardStatus"] == "Draft"
    content = json.loads(request["ModelCard"]["ModelCardContent"])
    assert set(content) <= {"model_overview", "intended_uses", "business_details", "training_details",
                            "evaluation_details", "additional_information"}  # no model_package_details
    assert set(content["model_overview"]) <= {"model_creator", "model_artifact"}
    assert content["model_overview"]["model_artifact"] == [entry["model"]]
    by_split = {e["metadata"]["split"]: {m["name"]: m["value"] for m in e["metric_groups"][0]["metric_data"]}
                for e in content["evaluation_details"]}
    for split, fig in comparison["splits"].items():
        assert by_split[split]["success_rate"] == fig["success_new"]
        assert by_split[split]["success_rate_gain_ci95_low"] == fig["success_diff_ci95"][0]
    details = content["additional_information"]["custom_details"]
    assert details["KFP_run_id"] == "run-9" and details["train_seed"] == "1234" and details["model_card"] == entry["model_card"]
    assert "mazerl pipeline submit --profile hyperpod-p5" in content["additional_information"]["caveats_and_recommendations"]
    described = hyperpod.describe_model_package(ModelPackageName=entry["model_package_arn"])
    assert described["CustomerMetadataProperties"]["model_card"] == entry["model_card"] == f"{root}/models/run-9/README.md"
    assert entry["model_card"] in described["ModelPackageDescription"]
    body = boto3.client("s3").get_object(Bucket=S3_TEST_BUCKET, Key="registry-sm/models/run-9/README.md")["Body"].read()
    _check_card(body.decode(), comparison)


@pytest.mark.parametrize("bad,why", [(None, "is missing"), ({}, "is missing"),
                                     ({"decision": "promote"}, "holds no promotion decision"),
                                     ({"decision": {"improved": True}}, "has no evaluated splits"),
                                     ({"decision": {"improved": True}, "splits": {}}, "has no evaluated splits")])
def test_a_card_without_its_comparison_is_a_clear_error_and_nothing_is_written(bad, why, tmp_path):
    from mazerl.workflow import promote, read_registry

    with pytest.raises(ModelCardError, match=f"cannot write the model card: the comparison {why}"):
        render_card(bad, {})
    with pytest.raises(ModelCardError, match=why):
        sagemaker_card_content(bad, {})
    root = tmp_path / "registry"
    with pytest.raises(ModelCardError, match=why):
        promote(str(_model(tmp_path)), str(root), bad, "hash1", "run-1")
    assert read_registry(str(root)) is None and not (root / "models").exists()


def test_the_promote_component_passes_the_run_s_facts_to_the_card(comparison_dir, small_mazes, tmp_path):
    from kfp.dsl import Dataset

    from mazerl.components.promote import promote as promote_component

    root = str(tmp_path / "registry")
    run = _run(small_mazes)["parameters"]
    where = promote_component(str(_model(tmp_path)), root, "hash3", Dataset(name="result", uri=str(comparison_dir)), "run-3",
                              load_profile("local").model_dump_json(), mazes=Dataset(name="mazes", uri=str(small_mazes)),
                              base_model="tiny-base", train_seed=1234, model_parameter=run["model"],
                              **{k: v for k, v in run.items() if k != "model"})
    card = (Path(where) / CARD_FILE).read_text()
    assert "--param train_seed=1234" in card and "--param dataset_preset=smoke" in card and "--param model=tiny-base" in card


def test_the_compiled_pipeline_hands_the_run_s_facts_to_promote(tmp_path):
    import yaml

    from mazerl.pipelines.run import compile_pipeline

    spec = yaml.safe_load(compile_pipeline(load_profile("local"), tmp_path / "p.yaml").read_text())

    def tasks(dag: dict):
        for name, task in dag.get("tasks", {}).items():
            yield name, task
            comp = spec["components"][task["componentRef"]["name"]]
            yield from tasks(comp.get("dag", {}))

    (promote,) = [t for n, t in tasks(spec["root"]["dag"]) if n == "promote"]
    inputs = promote["inputs"]
    wired = {name: next(iter(source.values())) for kind in ("artifacts", "parameters") for name, source in inputs[kind].items()}
    assert wired["mazes"] == "pipelinechannel--generate-mazes-mazes"
    assert wired["base_model"] == "pipelinechannel--resolve-model-Output"
    assert wired["train_seed"] == "pipelinechannel--draw-train-seed-Output"
    for name in ("model_view", "grpo_config", "dataset_preset", "heldout_mazes", "warm_start"):
        assert wired[name] == f"pipelinechannel--{name}", name
    assert wired["model_parameter"] == "pipelinechannel--model"


# ---- §4: dependencies as the design card names them ------------------------------------------------------

def _extras() -> dict[str, list[str]]:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def test_kubernetes_is_declared_where_it_is_imported_within_what_kfp_allows():
    from importlib.metadata import requires, version

    from packaging.requirements import Requirement
    from packaging.version import Version

    importers = sorted(str(p.relative_to(REPO / "src")) for p in (REPO / "src" / "mazerl").rglob("*.py")
                       if re.search(r"^\s*(from kubernetes[ .]|import kubernetes)", p.read_text(), re.M))
    assert importers, "nothing imports kubernetes any more: take it out of the kfp extra"
    declared = [Requirement(r) for r in _extras()["kfp"] if Requirement(r).name == "kubernetes"]
    assert declared, f"{', '.join(importers)} import kubernetes: declare it in the kfp extra"
    kfp_range = next(Requirement(r) for r in requires("kfp") if Requirement(r).name == "kubernetes" and not Requirement(r).marker)
    installed = Version(version("kubernetes"))
    assert declared[0].specifier.contains(installed) and kfp_range.specifier.contains(installed)
    # the declared range's upper bound is kfp's: never a version kfp refuses
    uppers = {s.version for s in declared[0].specifier if s.operator == "<"}
    assert uppers and uppers <= {s.version for s in kfp_range.specifier if s.operator == "<"}


def test_the_sagemaker_sdk_is_neither_imported_nor_installed():
    """mazerl makes single SageMaker API calls through boto3 (cluster/sagemaker.py); the SDK is not a dependency."""
    importers = [p for p in (REPO / "src").rglob("*.py") if re.search(r"^\s*(from sagemaker[ .]|import sagemaker\b)", p.read_text(), re.M)]
    assert importers == []
    from packaging.requirements import Requirement

    assert all(Requirement(r).name != "sagemaker" for reqs in _extras().values() for r in reqs)
    for lock in ("runtime.lock", "trainer.lock"):
        names = {line.split("==")[0].lower() for line in (REPO / "requirements" / lock).read_text().splitlines()
                 if line and not line.startswith("#")}
        assert not {n for n in names if n.startswith("sagemaker")}, lock
