"""Cluster evaluation with vLLM: the profile's eval_engine, the evaluate tasks it compiles to (image, engine),
workflow.evaluate on the vLLM CPU build (same greedy outcomes as the HF engine), and the capacity plan's
estimate of an evaluation's time (a roofline of batched decoding, tied here to the architecture)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from test_vllm_engine import vllm_python

REPO = Path(__file__).resolve().parents[1]

# Runs in the vLLM venv: one tiny model (vLLM-servable head size) evaluated on the same small splits by
# workflow.evaluate with engine hf and with engine vllm, as the evaluate component calls it (the view of the
# tiny-grpo job config); records both evaluations and what compare says of the pair.
EVAL_SCRIPT = r'''
import json
import sys
from pathlib import Path


def main(out_json, workdir, tests_dir):
    sys.path.insert(0, tests_dir)
    from vllm_checks import sharpened_tiny_model

    import pandas as pd

    from mazerl.mazes.splits import DatasetConfig, generate_dataset
    from mazerl.workflow import compare, evaluate

    work = Path(workdir)
    model = sharpened_tiny_model(work / "tiny", seed=1)
    # the view: a move every turn (action grammar), two images of history, so the episodes walk the mazes
    (model / "mazerl_policy.json").write_text(json.dumps({
        "reply_grammar": "action", "prompt": "short", "history": {"turns": None, "images": 2},
        "max_new_tokens": 8, "render_scale": 1.0}))
    generate_dataset(DatasetConfig.model_validate({"reference_splits": {}, "splits": {
        "heldout": {"count": 8, "sizes": ["3x3"], "placement": "random", "min_moves": 2, "max_turns": 6},
        "larger": {"count": 4, "sizes": ["4x4"], "placement": "random", "min_moves": 2, "max_turns": 6}}}), work / "mazes")
    results = {}
    for engine in ("hf", "vllm"):
        out = work / f"eval-{engine}"
        summary = evaluate(str(model), str(work / "mazes"), str(out), heldout_mazes=6, other_mazes=3, label=f"eval-{engine}",
                           config="tiny-grpo", engine=engine)
        episodes = pd.read_parquet(out / "episodes.parquet")
        results[engine] = {"meta": summary["meta"],
                           "episodes": episodes[["split", "maze_id", "success", "turns", "moves", "loop"]].to_dict("records")}
    try:
        compare(str(work / "eval-hf"), str(work / "eval-vllm"), str(work / "cmp"), 0.0, 0.05)
        results["compare_error"] = None
    except Exception as err:  # what compare says of a pair played by two engines
        results["compare_error"] = f"{type(err).__name__}: {err}"
    Path(out_json).write_text(json.dumps(results, default=str))


if __name__ == "__main__":  # vLLM spawns its engine process: the guard keeps it from rerunning this
    main(*sys.argv[1:4])
'''


@pytest.fixture(scope="module")
def evaluations(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("cluster-eval")
    script, out = work / "eval_engines.py", work / "evaluations.json"
    script.write_text(EVAL_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIRTUAL_ENV")}
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    proc = subprocess.run([vllm_python(), str(script), str(out), str(work), str(REPO / "tests")],
                          cwd=work, env=env, capture_output=True, text=True, timeout=1500)
    if proc.returncode != 0:
        pytest.fail(f"the evaluation script failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text())


def test_vllm_evaluation_plays_the_same_greedy_episodes_as_hf(evaluations):
    """Greedy decoding of a tiny fp32 model: vLLM's CPU kernels and transformers' pick the same move every
    turn (the model's LM head is sharpened so no choice hinges on float noise), so each maze's outcome,
    turns and moves agree exactly."""
    hf, vllm = evaluations["hf"]["episodes"], evaluations["vllm"]["episodes"]
    assert len(hf) == len(vllm) == 6 + 3
    assert hf == vllm
    assert sum(e["moves"] for e in hf) > len(hf), "the episodes barely moved: not a multi-turn comparison"
    assert {e["turns"] for e in hf} != {1}


def test_results_record_the_engine_and_compare_refuses_a_mixed_pair(evaluations):
    assert evaluations["hf"]["meta"]["engine"] == "hf" and evaluations["vllm"]["meta"]["engine"] == "vllm"
    assert evaluations["vllm"]["meta"]["dtype"] == "float32"  # CPU: the vLLM CPU build in float32
    assert evaluations["hf"]["meta"]["view"] == evaluations["vllm"]["meta"]["view"]  # the job's view, both
    error = evaluations["compare_error"]
    assert error is not None and "different inference engines (hf vs vllm)" in error


# ---- the profile's eval_engine and the evaluate tasks it compiles to ---------------------------------------------
def _compiled(tmp_path, profile: str) -> tuple[dict, dict]:
    from typer.testing import CliRunner

    from mazerl.cli import app

    out = tmp_path / f"{Path(profile).stem}.yaml"
    result = CliRunner().invoke(app, ["pipeline", "compile", "--profile", profile, "--out", str(out)])
    assert result.exit_code == 0, result.output
    import yaml

    docs = list(yaml.safe_load_all(out.read_text()))
    return docs[0], docs[1] if len(docs) > 1 else {}


def _evaluate_tasks(spec: dict) -> dict:
    """The two evaluate tasks of the compiled DAG (inside the exit handler), by task name."""
    outer = spec["root"]["dag"]["tasks"]["exit-handler-1"]
    inner = spec["components"][outer["componentRef"]["name"]]["dag"]["tasks"]
    return {name: task for name, task in inner.items() if name.startswith("evaluate")}


def test_hyperpod_p5_evaluates_with_vllm_in_the_trainer_image_on_a_gpu(tmp_path):
    from mazerl.profiles import load_profile

    profile = load_profile("hyperpod-p5")
    assert profile.eval_engine == "vllm"
    spec, _ = _compiled(tmp_path, "hyperpod-p5")
    executors = spec["deploymentSpec"]["executors"]
    evaluates = {k: v for k, v in executors.items() if k.startswith("exec-evaluate")}
    assert set(evaluates) == {"exec-evaluate", "exec-evaluate-2"}  # baseline and trained: one component, two tasks
    for executor in evaluates.values():
        assert executor["container"]["image"] == profile.images.trainer
        assert executor["container"]["resources"]["accelerator"]["resourceCount"] == "1"
    assert {e["container"]["image"] for k, e in executors.items() if k not in evaluates} == {profile.images.runtime}
    tasks = _evaluate_tasks(spec)
    assert len(tasks) == 2
    for task in tasks.values():  # a compile-time constant: both evaluations play on the same engine
        assert task["inputs"]["parameters"]["engine"]["runtimeValue"]["constant"] == "vllm"


def test_hyperpod_g5_and_local_profiles(tmp_path):
    from mazerl.profiles import load_profile

    g5 = load_profile("hyperpod-g5")
    spec, _ = _compiled(tmp_path, "hyperpod-g5")
    executors = spec["deploymentSpec"]["executors"]
    assert executors["exec-evaluate"]["container"]["image"] == g5.images.trainer
    assert executors["exec-evaluate"]["container"]["resources"]["accelerator"]["resourceCount"] == "1"
    local = load_profile("local")
    assert local.eval_engine == "hf"
    spec, _ = _compiled(tmp_path, "local")
    assert spec["deploymentSpec"]["executors"]["exec-evaluate"]["container"]["image"] == local.images.runtime
    assert {t["inputs"]["parameters"]["engine"]["runtimeValue"]["constant"] for t in _evaluate_tasks(spec).values()} == {"hf"}


@pytest.mark.parametrize("change,message", [
    (lambda raw: raw["images"].pop("trainer") and raw.pop("sagemaker"), "eval_engine vllm runs the evaluate tasks in images.trainer"),
    (lambda raw: raw.update(eval_gpus=0), "eval_engine vllm needs a GPU in each evaluate pod"),
    (lambda raw: raw.update(eval_engine="tgi"), "eval_engine"),
])
def test_a_profile_that_cannot_evaluate_with_vllm_is_refused(tmp_path, change, message):
    import yaml

    from mazerl.config import ConfigError
    from mazerl.profiles import PROFILE_DIR, load_profile

    raw = yaml.safe_load((PROFILE_DIR / "hyperpod-p5.yaml").read_text())
    raw["backend"] = "local" if "trainer" in message else raw["backend"]  # rayjob itself needs images.trainer
    if raw["backend"] == "local":
        raw.pop("rayjob"), raw.update(task_gpus=1)
    change(raw)
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=message) as err:
        load_profile(str(tmp_path / "p.yaml"))
    if message == "eval_engine":
        assert "'hf'" in str(err.value) and "'vllm'" in str(err.value)


def test_engine_vllm_where_vllm_is_missing_is_refused_before_any_work(tmp_path):
    """This venv has no vLLM: workflow.evaluate with engine vllm names the fix before reading the data."""
    import importlib.util

    from mazerl.config import ConfigError
    from mazerl.rollout.vllm_engine import VLLMUnavailableError
    from mazerl.workflow import evaluate

    assert importlib.util.find_spec("vllm") is None, "this check needs a Python without vLLM"
    with pytest.raises(VLLMUnavailableError, match="vLLM is not installed"):
        evaluate("tiny-base", str(tmp_path / "no-such-data"), str(tmp_path / "out"), 1, 1, engine="vllm")
    with pytest.raises(ConfigError, match="allowed hf, vllm"):
        evaluate("tiny-base", str(tmp_path / "no-such-data"), str(tmp_path / "out"), 1, 1, engine="tgi")
    assert not (tmp_path / "out").exists()


def test_vllm_limits_come_from_the_splits_evaluated(tiny_model_dir, small_mazes):
    """The evaluation's vLLM engine admits the longest prompt of the splits it plays (the most over the splits:
    `tiny` has the larger turn budget, 20 against heldout's 18, heldout the larger frames), and an explicit
    limit below that is refused."""
    import pandas as pd

    from mazerl.cluster.plan import PlanError, image_tokens_counter, prompt_limits, split_episodes
    from mazerl.evaluation.runner import with_engine_limits
    from mazerl.policy.config import PolicyConfig

    frames = [pd.read_parquet(small_mazes / f"{name}.parquet") for name in ("heldout", "tiny")]
    policy = PolicyConfig.for_model(str(tiny_model_dir), engine="vllm", history={"turns": None, "images": None})
    limited = with_engine_limits(policy, frames, None)
    heldout, tiny = (split_episodes(df, policy.render_scale, None) for df in frames)
    assert tiny.turn_budget == 20 > heldout.turn_budget
    counter = image_tokens_counter(str(tiny_model_dir))
    needed = [prompt_limits(policy, e, counter) for e in (heldout, tiny)]
    assert limited.vllm.max_model_len == max(n.tokens for n in needed)
    assert limited.vllm.max_images_per_prompt == max(n.images for n in needed) == 20
    assert with_engine_limits(policy.model_copy(update={"engine": "hf"}), frames, None).vllm.max_model_len is None
    low = policy.model_copy(update={"vllm": policy.vllm.model_copy(update={"max_images_per_prompt": 4})})
    with pytest.raises(PlanError, match="max_images_per_prompt = 4"):
        with_engine_limits(low, frames, None)


# ---- the plan's estimate of an evaluation's time ----------------------------------------------------------------
@pytest.fixture(scope="module")
def p5_plan():
    from mazerl.cluster.plan import build_plan, job_config_for_profile
    from mazerl.profiles import load_profile

    profile = load_profile("hyperpod-p5")
    cfg = job_config_for_profile(profile)
    return profile, cfg, build_plan(profile, cfg)


def _seconds(policy, model: str, groups, gpu: str = "ml.p5.48xlarge", engine: str = "vllm", reply_tokens=None) -> dict:
    from mazerl.cluster import plan as P

    directory = P.model_directory(model)
    arch = P.architecture(model)
    merge = int(getattr(P.image_processor(model), "merge_size", 2))
    return P.evaluation_seconds(policy.model_copy(update={"model": model}), engine, groups, arch,
                                P._attention_width(str(directory.resolve())), P.image_tokens_counter(model), merge * merge,
                                P.INSTANCE_TYPES[gpu], reply_tokens)


def test_plan_estimates_both_evaluations_of_the_profiles_splits(p5_plan):
    profile, cfg, plan = p5_plan
    e = plan.to_json()["evaluation"]
    d = profile.pipeline
    # heldout, the three other generated splits (each capped at eval_other_mazes) and the VisGym 64 + 64
    assert e["episodes"] == d.eval_heldout_mazes + 3 * d.eval_other_mazes + 64 + 64
    assert e["per_split"]["heldout"]["episodes"] == d.eval_heldout_mazes and e["per_split"]["heldout"]["turn_budgets"] == [18]
    assert e["engine"] == profile.eval_engine == "vllm" and e["gpu"].startswith("H100")
    assert e["seconds_per_run"] == pytest.approx(2 * e["seconds"], abs=0.2)
    assert e["seconds"] == pytest.approx(e["decode_seconds"] + e["prefill_seconds"], abs=0.2)
    assert e["seconds"] == pytest.approx(sum(s["seconds"] for s in e["per_split"].values()), rel=1e-3)
    assert e["max_new_tokens"] == cfg.policy.max_new_tokens == 1024
    # shorter replies decode less: the bound is the largest
    assert e["seconds"] > e["seconds_at_reply_tokens"]["256"] > e["seconds_at_reply_tokens"]["64"]
    from mazerl.cluster.plan import format_plan

    text = format_plan(plan)
    assert "evaluation (estimate, vllm on one H100" in text and "upper bound" in text and "every reply 1024 tokens" in text


def test_turn_prompts_follow_the_layout_the_vllm_limits_are_derived_from(p5_plan):
    from mazerl.cluster.plan import image_tokens_counter, pipeline_train_episodes, prompt_limits, turn_prompts

    _, cfg, _ = p5_plan
    episodes = pipeline_train_episodes("default", cfg.policy.render_scale, None)
    counter = image_tokens_counter(cfg.policy.model)
    image_tokens = max(counter(h, w) for h, w in episodes.frame_sizes)
    prompts = turn_prompts(cfg.policy, episodes.turn_budget, image_tokens)
    needed = prompt_limits(cfg.policy, episodes, counter)
    assert max(p for p, _ in prompts) + cfg.policy.max_new_tokens == needed.tokens
    assert max(i for _, i in prompts) == needed.images


def test_one_decode_step_is_the_weights_and_the_kv_cache_over_the_bandwidth(p5_plan):
    """One episode of one turn replying one token, full history: prefill of its prompt by FLOPs, then one decode
    step that reads the text weights and the prompt's KV cache once (bytes over the bandwidth share)."""
    from mazerl.cluster import plan as P

    _, cfg, _ = p5_plan
    model = cfg.policy.model
    group = P.EvalGroup("heldout", 1, 1, ((256, 256),))
    result = _seconds(cfg.policy, model, [group], reply_tokens=1)
    arch = P.architecture(model)
    gpu = P.GPU_THROUGHPUT["H100 80GB HBM3"]
    (prompt, images), = P.turn_prompts(cfg.policy, 1, P.image_tokens_counter(model)(256, 256), 1)
    bytes_read = arch.text_params * 2 + prompt * arch.kv_elements_per_token * 2
    assert result["decode_seconds"] == pytest.approx(bytes_read / (gpu.memory_bytes_per_s * P.DECODE_BANDWIDTH_SHARE), abs=0.06)
    assert result["prefill_seconds"] < 0.1 and images == 1


def test_estimate_scales_with_episodes_tokens_and_model(p5_plan):
    from mazerl.cluster.plan import EvalGroup

    _, cfg, _ = p5_plan
    model_8b, model_2b = "Qwen/Qwen3-VL-8B-Instruct", "Qwen/Qwen3-VL-2B-Instruct"
    frames = ((256, 256),)

    def total(episodes: int, budget: int = 18, model: str = model_8b, **kw) -> float:
        return _seconds(cfg.policy, model, [EvalGroup("heldout", episodes, budget, frames)], **kw)["seconds"]

    # waves of the same size: twice the episodes, twice the time
    assert total(2048) / total(1024) == pytest.approx(2.0, rel=0.02)
    # longer replies: more steps, each reading a longer KV cache (more than proportional)
    assert total(256, reply_tokens=512) / total(256, reply_tokens=256) > 2.0
    # more turns with full history: longer contexts every turn
    assert total(256, budget=36) / total(256, budget=18) > 2.0
    # the 8B model reads more weights and a larger KV cache per token than the 2B one: its time is at least the
    # smaller of the two ratios times the 2B model's
    from mazerl.cluster.plan import architecture

    big, small = architecture(model_8b), architecture(model_2b)
    least = min(big.text_params / small.text_params, big.kv_elements_per_token / small.kv_elements_per_token)
    assert least > 1.2
    assert total(256, model=model_8b) > least * total(256, model=model_2b)
    # the same work on an A10G (600 GB/s) against an H100 (3.35 TB/s)
    assert total(256, model=model_2b, gpu="ml.g5.12xlarge") > 4 * total(256, model=model_2b)
    # with full history vLLM's prefix cache prefills only each turn's new frame and text; HF prefills it all
    vllm = _seconds(cfg.policy, model_8b, [EvalGroup("heldout", 256, 18, frames)])
    hf = _seconds(cfg.policy, model_8b, [EvalGroup("heldout", 256, 18, frames)], engine="hf")
    assert hf["prefill_seconds"] > 5 * vllm["prefill_seconds"]


def test_estimate_follows_the_profiles_evaluation_sizes(tmp_path):
    import yaml

    from mazerl.cluster.plan import estimate_evaluation, hardware_of, job_config_for_profile
    from mazerl.profiles import PROFILE_DIR, load_profile

    raw = yaml.safe_load((PROFILE_DIR / "hyperpod-p5.yaml").read_text())
    estimates = []
    for heldout in (500, 1000):
        raw["pipeline"]["eval_heldout_mazes"] = heldout
        (tmp_path / "p.yaml").write_text(yaml.safe_dump(raw))
        profile = load_profile(str(tmp_path / "p.yaml"))
        estimates.append(estimate_evaluation(profile, job_config_for_profile(profile).policy, hardware_of(profile)[1]))
    small, big = estimates
    assert big["episodes"] - small["episodes"] == 500
    assert big["per_split"]["heldout"]["seconds"] == pytest.approx(2 * small["per_split"]["heldout"]["seconds"], rel=0.05)
    assert big["per_split"]["larger"] == small["per_split"]["larger"]
