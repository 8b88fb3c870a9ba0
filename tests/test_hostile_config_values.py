"""Hostile input (issue #32): setting values. `--set`/`--param` text keeps its meaning (a text setting
gets exactly what was typed: `off`, `007`, `null`), numbers that pass a lower bound but break later are
refused with the allowed range (seeds, temperatures, turn budgets, sizes), and YAML that expands
(anchors and aliases) or is oversized is refused before it is built, with a bounded message."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from typer.testing import CliRunner

from mazerl.cli import app
from mazerl.config import ConfigError, load_config, parse_overrides
from mazerl.rl.config import GRPOConfig, SFTConfig

runner = CliRunner()
MAX_SEED = 2**63 - 1  # what numpy, torch and Python generators all take (mazerl.config.MAX_SEED)
MESSAGE_LIMIT = 4000  # every message here is a few lines; a bomb's used to be megabytes


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def assert_clear_error(result, *fragments, code=2):
    """Exit `code`, one short message with the fragments in it, no traceback."""
    text = result.output
    assert result.exit_code == code, text[:3000]
    assert "Traceback" not in text and "internal error" not in text, text[:3000]
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)[:3000]
    assert len(text) < MESSAGE_LIMIT, f"{len(text)} characters: {text[:500]}"
    for f in fragments:
        assert f.lower() in " ".join(text.lower().split()), (f, text)


def grpo(*sets: str) -> GRPOConfig:
    return load_config(GRPOConfig, "tiny-grpo", parse_overrides(list(sets)))


# ------------------------------------------------------------------ --set keeps what was typed


@pytest.mark.parametrize("text", ["off", "on", "yes", "no", "y", "n", "null", "~", "true", "False", "007", "010", "1e3",
                                  "0x1f", "0o17", "1:30", "2024-01-01", "1_000", ".inf", "", " padded ", "a=b", "[1, 2]",
                                  "{a: 1}", "&x 1", "*x", "# not a comment", "'quoted'"])
def test_a_text_setting_gets_exactly_the_text_typed(text):
    cfg = grpo(f"output_dir={text}", f"train_data={text}")
    assert cfg.output_dir == text and cfg.train_data == text


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.text(max_size=40))
def test_any_text_typed_for_a_text_setting_round_trips(text):
    assert grpo(f"output_dir={text}").output_dir == text


@pytest.mark.parametrize("key, text, value", [
    ("autocast", "off", "off"), ("autocast", "auto", "auto"), ("policy.engine", "hf", "hf"),
    ("eval_data", "null", None), ("eval_data", "~", None), ("eval_data", "no", "no"), ("eval_data", "007", "007"),
    ("steps", "010", 10), ("steps", "0x10", 16), ("max_turns", "null", None), ("max_turns", "30", 30),
    ("temperature", "0.5", 0.5), ("optim.lr", "1e-5", 1e-5), ("skip_zero_advantage_turns", "off", False),
    ("skip_zero_advantage_turns", "true", True), ("optim.betas", "[0.8, 0.9]", (0.8, 0.9)), ("lora.r", "4", 4),
    ("policy.vllm", "{max_model_len: 512}", None),
])
def test_a_setting_is_read_by_its_type(key, text, value):
    cfg = grpo(f"{key}={text}")
    got = cfg
    for part in key.split("."):
        got = getattr(got, part)
    if key == "policy.vllm":
        assert got.max_model_len == 512
    else:
        assert got == value and type(got) is type(value)


def test_autocast_off_on_the_command_line_and_in_a_file(tmp_path):
    assert grpo("autocast=off").autocast == "off"
    config = tmp_path / "c.yaml"
    text = _shipped("tiny-grpo").read_text().replace("autocast: auto", "autocast: off")
    config.write_text(text + "\nseed: 010\n")
    cfg = load_config(GRPOConfig, config)
    assert cfg.autocast == "off" and cfg.seed == 10  # YAML 1.2: no on/off booleans, no 0-prefixed octal


def _shipped(name: str) -> Path:
    from mazerl.config import resolve_job_config

    return Path(resolve_job_config(name))


def test_yaml_files_read_words_and_dates_as_text(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("policy: {model: tiny-base}\ntrain_data: t.parquet\noutput_dir: 2024-01-01\neval_data: no\n")
    cfg = load_config(SFTConfig, config, {"train_data": "no"})
    assert cfg.output_dir == "2024-01-01" and cfg.eval_data == "no" and cfg.train_data == "no"


def test_a_bad_value_names_the_setting_and_shows_what_was_given():
    with pytest.raises(ConfigError) as err:
        grpo("autocast=sometimes")
    assert "autocast" in str(err.value) and "'off', 'bfloat16' or 'auto'" in str(err.value) and "sometimes" in str(err.value)
    with pytest.raises(ConfigError, match="steps"):
        grpo("steps=[1,")


def _package(tmp_path: Path) -> Path:
    """A compiled pipeline's parameter section, which is all check_parameters reads."""
    spec = {"pipelineInfo": {"name": "p"}, "root": {"inputDefinitions": {"parameters": {
        "model": {"parameterType": "STRING"}, "steps": {"parameterType": "NUMBER_INTEGER"},
        "gain": {"parameterType": "NUMBER_DOUBLE"}, "warm": {"parameterType": "BOOLEAN"}}}}}
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_pipeline_parameters_are_read_by_their_type(tmp_path):
    from mazerl.pipeline_spec import check_parameters

    package = _package(tmp_path)
    got = check_parameters(package, parse_overrides(["model=off", "steps=010", "gain=1", "warm=true"]))
    assert got == {"model": "off", "steps": 10, "gain": 1.0, "warm": True}
    assert check_parameters(package, parse_overrides(["model=007"]))["model"] == "007"
    assert check_parameters(package, {"steps": 3, "model": "x"}) == {"steps": 3, "model": "x"}  # typed values stay
    with pytest.raises(ConfigError, match="'many' is not an integer"):
        check_parameters(package, parse_overrides(["steps=many"]))
    with pytest.raises(ConfigError, match="finite"):
        check_parameters(package, parse_overrides(["gain=.nan"]))
    with pytest.raises(ConfigError, match="out of range"):
        check_parameters(package, parse_overrides([f"steps={2**64}"]))


# ------------------------------------------------------------------ numbers that break later


@pytest.mark.parametrize("seed", [2**63, 2**64, 10**30, -1])
def test_every_seed_setting_refuses_what_a_generator_cannot_take(seed, tmp_path):
    from mazerl.evaluation.runner import EvalConfig
    from mazerl.mazes.splits import DatasetConfig
    from mazerl.rl.pretrain import PretrainConfig
    from mazerl.rollout.engine import SamplingParams

    for make in (lambda: grpo(f"seed={seed}"),
                 lambda: load_config(SFTConfig, "tiny-sft", {"seed": seed}),
                 lambda: load_config(PretrainConfig, None, {"seed": seed}),
                 lambda: DatasetConfig.model_validate({"splits": {}, "eval_seed": seed}),
                 lambda: DatasetConfig.model_validate({"splits": {}, "train_seed": seed}),
                 lambda: SamplingParams(seed=seed),
                 lambda: EvalConfig(policy="oracle", data=["x"], out="o", seed=seed)):
        with pytest.raises((ConfigError, ValidationError)) as err:
            make()
        assert "seed" in str(err.value) and str(MAX_SEED) in str(err.value), str(err.value)
    assert grpo(f"seed={MAX_SEED}").seed == MAX_SEED
    from mazerl import config

    assert config.MAX_SEED == MAX_SEED


def test_seed_options_on_the_command_line_are_range_checked(tmp_path, small_mazes):
    big = 2**64
    assert_clear_error(run("mazes", "generate", "--preset", "smoke", "--train-seed", big, "--out", tmp_path / "m"),
                       "train_seed", str(MAX_SEED))
    assert_clear_error(run("mazes", "generate", "--preset", "smoke", "--train-seed", -1, "--out", tmp_path / "m"),
                       "train_seed", str(MAX_SEED))
    assert_clear_error(run("policy", "init-tiny", "--out", tmp_path / "t", "--seed", big), "--seed", str(MAX_SEED))
    assert_clear_error(run("eval", "--policy", "random", "--data", small_mazes / "tiny.parquet", "--out", tmp_path / "e",
                           "--seed", big), "seed", str(MAX_SEED))
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("value", ["1e-300", "1e-7", "1e39", "1e300"])
def test_a_temperature_that_float32_cannot_divide_by_is_refused(value):
    from mazerl.evaluation.runner import EvalConfig
    from mazerl.rollout.engine import SamplingParams

    for make in (lambda: grpo(f"temperature={value}"),
                 lambda: SamplingParams(temperature=float(value)),
                 lambda: EvalConfig(policy="oracle", data=["x"], out="o", temperature=float(value))):
        with pytest.raises((ConfigError, ValidationError)) as err:
            make()
        assert "temperature" in str(err.value) and "1e-05" in str(err.value), str(err.value)
    assert SamplingParams(temperature=0.0).greedy and grpo("temperature=1e-5").temperature == 1e-5


def test_eval_temperature_and_turn_budget_options_are_range_checked(tmp_path, small_mazes):
    data = small_mazes / "tiny.parquet"
    assert_clear_error(run("eval", "--policy", "random", "--data", data, "--out", tmp_path / "e", "--samples", 1,
                           "--temperature", "1e-300"), "temperature")
    assert_clear_error(run("eval", "--policy", "random", "--data", data, "--out", tmp_path / "e", "--max-turns", 10**9),
                       "max_turns")
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("setting", [
    "max_turns=1000000000", "max_turns=16385", "mazes_per_step=10000000", "group_size=100000", "micro_batch=10000000",
    "eval_mazes=1000000000", "max_minutes=1e300", "eval_every_minutes=1e300", "distributed.placement_timeout_s=1e300",
    "distributed.cpus_per_actor=1e300", "distributed.gpus_per_rank=1.5", "distributed.gpus_per_rank=1e300",
    "distributed.gpus_per_rollout_worker=2.5",
    "policy.vllm.max_model_len=100000000000", "policy.vllm.max_images_per_prompt=100000000", "lora.r=100000000",
    "lora.alpha=100000000", "mini_batch_mazes=10000000", "update_turns_per_episode=100000000",
])
def test_numbers_with_only_a_lower_bound_now_have_an_upper_one(setting):
    key = setting.split("=")[0]
    with pytest.raises(ConfigError) as err:
        grpo(setting)
    assert key in str(err.value), str(err.value)


def test_the_largest_turn_budget_fits_the_largest_maze():
    from mazerl.config import MAX_TURN_BUDGET
    from mazerl.mazes.layout import MAX_CELLS
    from mazerl.mazes.splits import default_turn_budget

    longest_route = 2 * (MAX_CELLS * MAX_CELLS - 1)  # through every cell, two squares a cell
    assert MAX_TURN_BUDGET >= default_turn_budget(longest_route)
    assert grpo(f"max_turns={MAX_TURN_BUDGET}").max_turns == MAX_TURN_BUDGET


def _config_models():
    import importlib
    import pkgutil

    import mazerl
    from pydantic import BaseModel

    for info in pkgutil.walk_packages(mazerl.__path__, "mazerl."):
        if info.name.startswith(("mazerl.pipelines", "mazerl.components", "mazerl.distributed")) or "vllm" in info.name:
            continue  # kfp / ray / vllm imports; their configs are the ones checked here
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, BaseModel) and obj.__module__ == info.name:
                yield obj


def test_every_config_model_refuses_nan_and_infinity():
    checked = 0
    for model in _config_models():
        for name, field in model.model_fields.items():
            if field.annotation not in (float, float | None):
                continue
            for bad in (math.nan, math.inf, -math.inf):
                try:
                    model.model_validate({name: bad})
                except ValidationError as err:
                    kinds = {e["type"] for e in err.errors() if e["loc"][:1] == (name,)}
                    assert kinds & {"finite_number", "greater_than", "greater_than_equal", "less_than",
                                    "less_than_equal"}, (model, name, bad, kinds)
                else:
                    raise AssertionError(f"{model.__name__}.{name} accepted {bad}")
                checked += 1
    assert checked > 50


# ------------------------------------------------------------------ YAML bombs and sizes


BOMB = textwrap.dedent("""\
    a: &a [x, x, x, x, x, x, x, x, x]
    b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
    c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
    d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
    e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
    f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
    g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
    policy: {model: tiny-base, history: *g}
    """)


@pytest.mark.parametrize("command", [["train", "grpo", "--config"], ["train", "sft", "--config"],
                                     ["mazes", "generate", "--out", "OUT", "--config"],
                                     ["pipeline", "compile", "--out", "OUT", "--profile"]])
def test_a_yaml_alias_bomb_is_refused_before_it_expands(tmp_path, command):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMB)
    args = [str(tmp_path / "out.yaml") if a == "OUT" else a for a in command]
    assert_clear_error(run(*args, bomb), "line 1", "anchors")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bomb.yaml"]


def test_an_anchor_alone_and_an_alias_in_a_set_value_are_refused(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(_shipped("tiny-grpo").read_text() + "\nseed: &n 5\n")
    with pytest.raises(ConfigError, match="anchors"):
        load_config(GRPOConfig, config)
    with pytest.raises(ConfigError, match="anchors"):
        grpo("lora={target_modules: &m [a, b], r: 4}")
    with pytest.raises(ConfigError, match="anchors"):
        grpo("optim.betas=[&b 0.5, *b]")


def test_a_config_file_over_a_mebibyte_is_refused(tmp_path):
    config = tmp_path / "big.yaml"
    config.write_text(_shipped("tiny-grpo").read_text() + "#" * 2**20 + "\n")
    assert_clear_error(run("train", "grpo", "--config", config), "larger than 1 MiB")


def test_messages_stay_short_whatever_the_input(tmp_path):
    many = tmp_path / "many.yaml"  # 10,000 bad list items: one error each
    many.write_text(_shipped("tiny-grpo").read_text() + "\nlora: {target_modules: [" + ", ".join(["[1]"] * 10_000) + "]}\n")
    result = run("train", "grpo", "--config", many)
    assert_clear_error(result, "lora.target_modules", "more")
    huge = "x" * 100_000
    assert_clear_error(run("train", "grpo", "--config", "tiny-grpo", "--set", f"autocast={huge}"), "autocast", "xxxx")
    assert_clear_error(run("train", "grpo", "--config", "tiny-grpo", "--set", f"output_dir={huge}",
                           "--set", "output_dir.sub=1"), "'output_dir' is a value")
    profile = tmp_path / "p.yaml"
    profile.write_text("kind: local\nname: " + "y" * 100_000 + "\nnot_a_setting: [" + ", ".join(["1"] * 10_000) + "]\n")
    assert_clear_error(run("pipeline", "compile", "--profile", profile, "--out", tmp_path / "o.yaml"), "invalid config")


# ---- extends: a job config that states only what it changes


def test_a_config_extends_another_and_changes_only_what_it_states(tmp_path):
    parent = tmp_path / "recipes" / "base.yaml"
    parent.parent.mkdir()
    parent.write_text("policy: {model: tiny-base}\ntrain_data: t.parquet\noutput_dir: o\nsteps: 40\n"
                      "optim: {lr: 1.0e-4, schedule: cosine}\nenv: {loop_penalty: 0.3}\n")
    child = tmp_path / "recipes" / "longer.yaml"  # a relative path: next to the extending file, not the cwd
    child.write_text("extends: base.yaml\nsteps: 90\noptim: {lr: 5.0e-5}\n")
    cfg = load_config(GRPOConfig, child)
    assert cfg.steps == 90 and cfg.optim.lr == 5e-5
    assert cfg.optim.schedule == "cosine" and cfg.env.loop_penalty == 0.3  # a section merges key by key
    assert cfg.train_data == "t.parquet"
    grandchild = tmp_path / "g.yaml"
    grandchild.write_text(f"extends: {child}\nseed: 7\n")
    cfg = load_config(GRPOConfig, grandchild, {"env.loop_penalty": "1.0"})
    assert (cfg.seed, cfg.steps, cfg.optim.schedule, cfg.env.loop_penalty) == (7, 90, "cosine", 1.0)


def test_a_shipped_config_extends_by_name_and_the_named_view_sees_the_parents_policy(tmp_path):
    from mazerl.workflow import named_view_overrides

    child = tmp_path / "c.yaml"
    child.write_text("extends: tiny-grpo\nsteps: 3\n")
    cfg, demo = load_config(GRPOConfig, child), load_config(GRPOConfig, "tiny-grpo")
    assert cfg.steps == 3 and cfg.model_dump(exclude={"steps"}) == demo.model_dump(exclude={"steps"})
    # a view named for the start model fills only the policy fields the whole chain leaves unset
    parent = tmp_path / "p.yaml"
    parent.write_text("extends: tiny-grpo\npolicy: {prompt: short, max_new_tokens: 8}\n")
    child.write_text(f"extends: {parent}\nsteps: 3\n")
    assert load_config(GRPOConfig, child).policy.model == demo.policy.model  # the grandparent's, beside the parent's
    filled = named_view_overrides(str(child), "visgym")
    assert "policy.prompt" not in filled and "policy.max_new_tokens" not in filled
    assert filled["policy.reply_grammar"] == "free"


@pytest.mark.parametrize("text, message", [
    ("extends: nowhere-to-be-found\n", "unknown config 'nowhere-to-be-found'"),
    ("extends: missing.yaml\n", "config file not found"),
    ("extends: [tiny-grpo]\n", "is not a config name"),
    ("extends: ''\n", "is not a config name"),
    ("extends: self.yaml\n", "extends makes a cycle"),
])
def test_a_bad_extends_is_a_clear_error(tmp_path, text, message):
    path = tmp_path / "self.yaml"
    path.write_text(text + "steps: 3\n")
    with pytest.raises(ConfigError, match=message):
        load_config(GRPOConfig, path)


def test_a_cycle_through_two_configs_is_named_and_refused(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(ConfigError, match=r"cycle \(.*a\.yaml -> .*b\.yaml -> .*a\.yaml\)"):
        load_config(GRPOConfig, tmp_path / "a.yaml")
    result = CliRunner().invoke(app, ["train", "grpo", "--config", str(tmp_path / "a.yaml")])
    assert result.exit_code == 2 and "cycle" in result.output and "Traceback" not in result.output
