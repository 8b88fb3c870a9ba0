"""Named views (policy.views): a model trained elsewhere, with no mazerl_policy.json, is evaluated with a view
named explicitly (`mazerl eval --view`, the pipeline's `model_view`), never with silent defaults; the view used
is recorded in summary.json and the reports."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mazerl.cli import app
from mazerl.policy.config import PolicyConfig
from mazerl.policy.views import VIEW_NAMES, ViewError, choose_view, named_view, view_hash

from conftest import assert_clear_error

runner = CliRunner()

VISGYM = {"prompt": "full", "history": {"turns": None, "images": None}, "reply_grammar": "free",
          "max_new_tokens": 1024, "render_scale": 1.0}


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def bare_model(tmp_path_factory) -> Path:
    """tiny-base as a model trained elsewhere: no mazerl_policy.json. Its text's final norm is zeroed, so every
    logit ties and greedy decoding ends each reply at once: 1,024 new tokens a turn cost nothing here."""
    from safetensors.torch import load_file, save_file

    from mazerl.policy.loading import resolve_model_name

    model = tmp_path_factory.mktemp("models") / "elsewhere"
    shutil.copytree(resolve_model_name("tiny-base"), model)
    (model / PolicyConfig.VIEW_FILE).unlink()
    weights = load_file(model / "model.safetensors")
    weights["model.language_model.norm.weight"].zero_()
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    return model


@pytest.fixture(scope="module")
def mazes(tmp_path_factory) -> Path:
    """One small heldout maze (and the train split a dataset needs)."""
    from mazerl.mazes.splits import DatasetConfig, generate_dataset

    out = tmp_path_factory.mktemp("data") / "mazes"
    generate_dataset(DatasetConfig.model_validate({"reference_splits": {}, "splits": {
        "heldout": {"count": 1, "sizes": ["2x2"], "max_turns": 5}, "train": {"count": 2, "sizes": ["3x3"]}}}), out)
    return out


# ---- the registry -------------------------------------------------------------------------------------------

def test_the_visgym_view_is_the_skyrl_recipes():
    from mazerl.envs.actions import ACTIONS
    from mazerl.mazes.render import RenderOptions
    from mazerl.mazes.visgym import VISGYM_MAX_TURNS
    from mazerl.policy.prompts import PROMPTS

    view = named_view("visgym")
    assert view.settings == VISGYM  # full prompt, full history, free-form replies, the recipe's 1024 tokens a turn
    assert view.recipe["model"] == "Qwen/Qwen3-VL-8B-Instruct" and view.recipe["env_id"] == "maze_2d/easy"
    assert view.recipe["max_turns"] == VISGYM_MAX_TURNS == 18  # the split's budget, as the reference splits carry
    assert RenderOptions().square_px == 25  # render scale 1: VisGym's 25 px a square
    # the recipe asks for a reply ending <action>ACTION</action>; mazerl's full prompt says the same
    prompt = PROMPTS[view.settings["prompt"]]
    assert "<action>ACTION</action>" in prompt and all(a in prompt for a in ACTIONS)
    # every setting is a valid PolicyConfig view, applied as given
    assert PolicyConfig(model="-", **view.settings).view() == VISGYM


def test_the_mazerl_view_is_policy_configs_defaults():
    assert set(VIEW_NAMES) >= {"visgym", "mazerl"}
    assert named_view("mazerl").settings == PolicyConfig(model="no-such-model-dir").view()
    assert view_hash(named_view("visgym").settings) != view_hash(named_view("mazerl").settings)
    assert view_hash(dict(reversed(list(VISGYM.items())))) == view_hash(VISGYM)  # order does not matter


def test_an_unknown_view_name_lists_the_views():
    with pytest.raises(ViewError, match=r"unknown view 'skyrl': allowed visgym, mazerl"):
        named_view("skyrl")


def test_the_choice_rule(bare_model):
    with pytest.raises(ViewError, match="has no mazerl_policy.json") as err:
        choose_view(str(bare_model), None)
    assert "--view NAME" in str(err.value) and "visgym (" in str(err.value) and "mazerl (" in str(err.value)
    assert choose_view(str(bare_model), "visgym").settings == VISGYM
    own = choose_view("tiny-base", None)  # mazerl's own models: their file, unchanged
    assert own.name == "saved" and own.settings["reply_grammar"] == "action" and own.replaced is None
    explicit = choose_view("tiny-base", "visgym")  # an explicit name wins over the file; what it replaced is kept
    assert explicit.settings == VISGYM and explicit.replaced == own.settings


# ---- mazerl eval --------------------------------------------------------------------------------------------

def test_eval_with_view_visgym_records_the_view(bare_model, mazes, tmp_path):
    out = tmp_path / "e"
    result = run("eval", "--model", bare_model, "--view", "visgym", "--data", mazes / "heldout.parquet", "--out", out)
    assert result.exit_code == 0, result.output
    meta = json.loads((out / "summary.json").read_text())["meta"]
    assert meta["view"] == VISGYM
    assert meta["view_choice"] == {"name": "visgym", "source": "named view visgym", "hash": view_hash(VISGYM)}
    for report in ("report.md", "report.html"):
        text = (out / report).read_text()
        assert f"View: visgym (named view visgym; hash {view_hash(VISGYM)})" in text, report
        assert "max_new_tokens 1024" in text and "history {" in text, report


def test_eval_without_view_of_a_model_without_view_file_lists_the_views(bare_model, mazes, tmp_path):
    result = run("eval", "--model", bare_model, "--data", mazes / "heldout.parquet", "--out", tmp_path / "e")
    assert_clear_error(result, "has no mazerl_policy.json", "--view NAME", "visgym (the SkyRL VisGym", "mazerl (")
    assert not (tmp_path / "e").exists()  # refused before anything was played or written


def test_eval_with_an_unknown_view_lists_the_views(bare_model, mazes, tmp_path):
    for model in (bare_model, "tiny-base"):
        result = run("eval", "--model", model, "--view", "skyrl", "--data", mazes / "heldout.parquet",
                     "--out", tmp_path / "e")
        assert_clear_error(result, "unknown view 'skyrl'", "allowed visgym, mazerl")
    result = run("eval", "--policy", "oracle", "--view", "visgym", "--data", mazes / "heldout.parquet", "--out", tmp_path / "o")
    assert_clear_error(result, "--view", "used only with --policy model")


def test_mazerl_models_keep_their_own_view(mazes, tmp_path):
    from mazerl.policy.loading import resolve_model_name

    saved = json.loads((Path(resolve_model_name("tiny-base")) / PolicyConfig.VIEW_FILE).read_text())
    out = tmp_path / "own"
    result = run("eval", "--model", "tiny-base", "--data", mazes / "heldout.parquet", "--out", out)
    assert result.exit_code == 0, result.output
    meta = json.loads((out / "summary.json").read_text())["meta"]
    assert meta["view"] == saved and meta["view_choice"]["name"] == "saved"
    assert meta["view_choice"]["source"].endswith("tiny-base/mazerl_policy.json")
    # an explicit view wins over the file: said on the console and recorded with what it replaced
    out = tmp_path / "named"
    result = run("eval", "--model", "tiny-base", "--view", "mazerl", "--max-turns", "1", "--data",
                 mazes / "heldout.parquet", "--out", out)
    assert result.exit_code == 0, result.output
    assert "--view mazerl replaces the model's own mazerl_policy.json" in " ".join(result.output.split())
    meta = json.loads((out / "summary.json").read_text())["meta"]
    assert meta["view"] == named_view("mazerl").settings and meta["view_choice"]["replaced_saved_view"] == saved
    assert "replaces the model's saved view" in (out / "report.md").read_text()


# ---- the pipeline -------------------------------------------------------------------------------------------

def test_workflow_evaluate_needs_a_view_for_a_model_without_one(bare_model, mazes, tmp_path):
    from mazerl import workflow

    with pytest.raises(ViewError, match="the pipeline parameter model_view NAME"):
        workflow.evaluate(str(bare_model), str(mazes), str(tmp_path / "none"), 1, 1)
    with pytest.raises(ViewError, match="unknown view 'skyrl'"):
        workflow.evaluate(str(bare_model), str(mazes), str(tmp_path / "bad"), 1, 1, model_view="skyrl")
    summary = workflow.evaluate(str(bare_model), str(mazes), str(tmp_path / "visgym"), 1, 1, model_view="visgym")
    assert summary["meta"]["view"] == VISGYM and summary["meta"]["view_choice"]["name"] == "visgym"
    # with the job config: the named view takes the saved view's place beneath the job's own settings
    summary = workflow.evaluate(str(bare_model), str(mazes), str(tmp_path / "job"), 1, 1, config="tiny-grpo",
                                model_view="visgym")
    assert summary["meta"]["view"] == VISGYM  # tiny-grpo sets no view field
    assert summary["meta"]["view_choice"]["source"] == "job config tiny-grpo over named view visgym"


def test_a_named_view_fills_only_what_the_job_config_leaves_unset(mazes):
    from mazerl import workflow

    # the shipped 8B job sets prompt, history and 1024 tokens itself; the view adds the grammar and the scale
    assert workflow.named_view_overrides("qwen3vl-8b-grpo", "visgym") == {"policy.reply_grammar": "free",
                                                                           "policy.render_scale": 1.0}
    assert workflow.named_view_overrides("qwen3vl-8b-grpo", "") == {}
    # training a model without a view file (here tiny-base's job, whose model has one: the named view wins)
    assert workflow.job_view("tiny-grpo", "tiny-base", str(mazes), "visgym") == VISGYM
    assert workflow.job_view("tiny-grpo", "tiny-base", str(mazes))["reply_grammar"] == "action"
    # a setting given explicitly (a --set / the steps parameter's kind) wins over the view
    extra = {"policy.max_new_tokens": 8}
    assert "policy.max_new_tokens" not in workflow.named_view_overrides("tiny-grpo", "visgym", extra)


@pytest.fixture(scope="module")
def local_spec(tmp_path_factory) -> Path:
    from mazerl.pipelines.run import compile_pipeline
    from mazerl.profiles import load_profile

    return compile_pipeline(load_profile("local"), tmp_path_factory.mktemp("spec") / "pipeline.yaml")


def test_the_pipeline_has_a_model_view_parameter_checked_before_a_run(local_spec):
    import yaml

    from mazerl.kfp_remote import prepare
    from mazerl.pipelines.run import check_arguments
    from mazerl.profiles import load_profile

    spec = yaml.safe_load(local_spec.read_text())
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert params["model_view"]["defaultValue"] == "" and params["model_view"]["parameterType"] == "STRING"
    tasks = spec["root"]["dag"]["tasks"]
    inner = next(t for t in spec["components"].values() if "dag" in t and "evaluate" in json.dumps(t["dag"]["tasks"]))
    given = [name for name, t in inner["dag"]["tasks"].items()
             if "model_view" in t.get("inputs", {}).get("parameters", {})]
    assert {"warm-start", "train-grpo", "evaluate", "evaluate-2"} <= set(given), (given, list(tasks))
    profile = load_profile("local")
    assert check_arguments(profile, {"model_view": "visgym"})["model_view"] == "visgym"
    with pytest.raises(ViewError, match="unknown view 'skyrl': allowed visgym, mazerl"):
        check_arguments(profile, {"model_view": "skyrl"})
    # a remote submission: refused before any connection is made (conn is never used)
    with pytest.raises(ViewError, match="unknown view 'skyrl'"):
        prepare(None, local_spec, {"model_view": "skyrl"}, "exp", namespace=None, pipeline_root=None, service_account=None)


def test_a_new_tiny_model_carries_the_mazerl_view(tmp_path):
    """`policy init-tiny` models are mazerl's own: they carry the view they were shown until now (the
    defaults), so they are evaluated as before without a --view."""
    from mazerl.policy.tiny import init_tiny

    model = init_tiny(tmp_path / "t", size="small")
    assert json.loads((model / PolicyConfig.VIEW_FILE).read_text()) == named_view("mazerl").settings
    assert choose_view(str(model), None).name == "saved"


def test_warm_start_and_training_take_the_named_view(bare_model, mazes, tmp_path, monkeypatch):
    """The pipeline's training steps build their policy with model_view where the starting model's file would be
    (the trainers themselves are replaced by recorders of the config they were given)."""
    import mazerl.rl.sft
    import mazerl.rl.trainer
    from mazerl import workflow

    seen = {}
    monkeypatch.setattr(mazerl.rl.sft, "train_sft", lambda cfg, *a, **k: seen.setdefault("sft", cfg.policy.view()))

    class Recorder:
        def __init__(self, cfg, on_step=None):
            seen["grpo"] = cfg.policy.view()

        def run(self, *a, **k):
            return {}

    monkeypatch.setattr(mazerl.rl.trainer, "GRPOTrainer", Recorder)
    workflow.warm_start(str(bare_model), str(mazes), "tiny-sft", str(tmp_path / "sft"), model_view="visgym")
    # tiny-sft sets its own prompt, history, scale and tokens: the view fills only the grammar
    assert seen["sft"] == {"prompt": "short", "history": {"turns": 0, "images": 1}, "render_scale": 1.28,
                           "max_new_tokens": 8, "reply_grammar": "free"}
    workflow.train_grpo(str(bare_model), str(mazes), "tiny-grpo", str(tmp_path / "grpo"), model_view="visgym")
    assert seen["grpo"] == VISGYM
    with pytest.raises(ViewError, match="unknown view 'skyrl'"):
        workflow.train_grpo(str(bare_model), str(mazes), "tiny-grpo", str(tmp_path / "g2"), model_view="skyrl")
