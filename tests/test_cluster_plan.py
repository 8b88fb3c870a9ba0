"""The capacity plan (mazerl.cluster.plan, `mazerl cluster plan`): parameters counted on the real architectures
built on the meta device, per-GPU memory against the profile's GPUs, the vLLM per-prompt limits the history
needs, and the same check wherever a job config meets a profile (compile, render-rayjob, the train step).

What cannot run here (8B weights, H100s): everything is computed from the shipped Qwen3-VL configs; no GPU
memory is measured."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from mazerl.cli import app
from mazerl.cluster.plan import (PlanError, architecture, check_profile, image_tokens_counter, pipeline_train_episodes,
                                 prompt_limits, resolve_prompt_limits)
from mazerl.profiles import PROFILE_DIR, load_profile
from mazerl.rl.config import DistributedSettings

CHECKPOINTING = "activation_checkpointing" in DistributedSettings.model_fields


def plan_cli(*args: str):
    return CliRunner().invoke(app, ["cluster", "plan", *args])


def profile_file(tmp_path, name: str = "hyperpod-p5", **rayjob) -> str:
    raw = yaml.safe_load((PROFILE_DIR / f"{name}.yaml").read_text())
    raw["rayjob"].update(rayjob)
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def test_the_8b_architecture_built_on_the_meta_device_has_8_8_billion_parameters():
    arch = architecture("Qwen/Qwen3-VL-8B-Instruct")
    assert 8.7e9 <= arch.total_params <= 8.8e9
    assert arch.text_params + arch.vision_params == arch.total_params
    assert 0.55e9 <= arch.vision_params <= 0.6e9  # the 27-block vision tower
    small = architecture("Qwen/Qwen3-VL-2B-Instruct")
    assert 2.0e9 <= small.total_params <= 2.2e9 and small.head_params == 0  # 2B ties its LM head to the embeddings


def test_the_shipped_p5_plan_fits_and_reports_every_term():
    result = plan_cli("--profile", "hyperpod-p5", "--json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["fits"] is True and plan["gpus"] == 8 and plan["gpu_bytes"] > 79 * 2**30
    assert set(plan["parameters"]) == {"text", "vision", "total"} and plan["parameters"]["total"] > 8.7e9
    assert {"master_weights", "gradients", "optimizer", "reference", "gathered_unit", "activations", "vllm_weights",
            "kv_cache", "total"} <= set(plan["per_gpu_bytes"])
    assert plan["per_gpu_bytes"]["total"] <= plan["gpu_bytes"]
    assert plan["per_gpu_bytes"]["total"] == max(plan["phases"].values())
    # full history: turn 18 carries 18 frames and 17 replies of up to 1,024 tokens
    assert plan["vllm_limits_needed"]["images"] == 18 and plan["vllm_limits_needed"]["tokens"] > 18 * 1024
    assert plan["vllm_limits"] == plan["vllm_limits_needed"]  # unset in the shipped config: derived
    # colocated (direct): every engine receives one copy of the bf16 weights (not the fp32 masters) from the
    # rank beside it, none through the driver; a checkpoint holds the fp32 weights and AdamW's two fp32 moments
    total = plan["parameters"]["total"]
    assert plan["weight_sync_bytes_per_step"] == total * 2 * 8
    assert plan["checkpoint_bytes"] == total * 4 * 3
    text = plan_cli("--profile", "hyperpod-p5")
    assert text.exit_code == 0 and "fits" in text.stdout and "H100" in text.stdout


def test_the_shipped_g5_plan_fits():
    result = plan_cli("--profile", "hyperpod-g5", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["fits"] is True


def test_a_micro_batch_of_64_without_activation_checkpointing_is_refused_naming_the_fields():
    sets = ["--set", "micro_batch=64"] + (["--set", "distributed.activation_checkpointing=false"] if CHECKPOINTING else [])
    result = plan_cli("--profile", "hyperpod-p5", *sets)
    assert result.exit_code == 2, result.output
    assert "micro_batch" in result.output and "activation_checkpointing" in result.output and "needs" in result.output


def test_one_gpu_is_refused_naming_the_gpus_it_needs(tmp_path):
    result = plan_cli("--profile", profile_file(tmp_path, gpus_per_worker=1), "--json")
    assert result.exit_code == 2, result.output
    assert "distributed.ranks = 1" in result.output and "GPUs" in result.output
    assert json.loads(result.stdout)["fits"] is False


# ---- defect 2: vLLM's per-prompt limits come from the history, never too small -------------------------------
@pytest.mark.parametrize("setting, needed", [("policy.vllm.max_images_per_prompt=8", "needs >= 18"),
                                             ("policy.vllm.max_model_len=4096", "policy.vllm.max_model_len = 4096")])
def test_limits_set_explicitly_too_low_are_refused_never_raised(setting, needed):
    result = plan_cli("--profile", "hyperpod-p5", "--set", setting)
    assert result.exit_code == 2, result.output
    assert setting.split("=")[0] in result.output and needed in result.output


def test_the_rayjob_s_driver_runs_the_shipped_8b_config_with_limits_that_admit_turn_18(small_mazes):
    """The config the RayJob's driver reads (the shipped 8B config with the profile's sizing: vLLM) gets
    limits that admit the 18th turn's prompt of full history: 18 images (it was 8) and every earlier reply."""
    from mazerl.cluster.rayjob import build_rayjob, driver_job_config
    from mazerl.mazes.dataset_io import read_split

    cfg = driver_job_config(build_rayjob(load_profile("hyperpod-p5"), "qwen3vl-8b-grpo", "run")["spec"]["entrypoint"])
    assert cfg.policy.engine == "vllm"
    train = read_split(str(small_mazes / "train.parquet"))
    resolved = resolve_prompt_limits(cfg.model_copy(update={"max_turns": 18}), train)
    assert resolved.policy.vllm.max_images_per_prompt >= 18
    assert resolved.policy.vllm.max_model_len >= 18 * 64 + 17 * 1026 + 1024  # frames, replies, the last reply


def test_prompt_limits_bound_a_real_conversation_of_full_history():
    """The derived limits hold the longest conversation the chat format really builds (the tiny model's
    processor and tokenizer), every reply at max_new_tokens, through the whole turn budget."""
    from mazerl.config import load_config
    from mazerl.envs.maze_env import FEEDBACK_INVALID
    from mazerl.policy.chat import ChatFormat, Conversation
    from mazerl.policy.loading import load_policy
    from mazerl.policy.prompts import PROMPTS, turn_text
    from mazerl.rl.config import GRPOConfig

    cfg = load_config(GRPOConfig, "tiny-grpo", {"policy.history.turns": "null", "policy.history.images": "null",
                                                "policy.max_new_tokens": 12, "policy.engine": "vllm"})
    episodes = pipeline_train_episodes("default", cfg.policy.render_scale, 6)
    limits = prompt_limits(cfg.policy, episodes, image_tokens_counter(cfg.policy.model))
    chat = ChatFormat(load_policy(cfg.policy.model, dtype="float32", device="cpu").processor, PROMPTS[cfg.policy.prompt])
    frame = np.zeros((*episodes.frame_sizes[0], 3), dtype=np.uint8)
    conv = Conversation()
    conv.add(chat.system())
    longest = 0
    for turn in range(1, 7):
        conv.add(chat.user_turn(turn, turn_text(FEEDBACK_INVALID, turn, 6), frame))
        context = conv.context(None, None)
        longest = max(longest, len(context.ids) + cfg.policy.max_new_tokens)
        conv.record_turn(context, chat.reply(turn, [chat.tokenizer.encode("a")[0]] * cfg.policy.max_new_tokens,
                                             [0.0] * cfg.policy.max_new_tokens))
    assert limits.images == len(context.images) == 6
    assert longest <= limits.tokens


# ---- the same check wherever a job config meets a profile ------------------------------------------------------
def test_compile_and_render_refuse_a_profile_the_job_does_not_fit(tmp_path):
    from mazerl.cluster.rayjob import build_rayjob

    one_gpu = load_profile(profile_file(tmp_path, gpus_per_worker=1))
    with pytest.raises(PlanError, match="needs >= .* GPUs"):
        check_profile(one_gpu)
    with pytest.raises(PlanError, match="distributed.ranks = 1"):
        build_rayjob(one_gpu, "qwen3vl-8b-grpo", "run")
    compiled = CliRunner().invoke(app, ["pipeline", "compile", "--profile", str(tmp_path / "profile.yaml"),
                                        "--out", str(tmp_path / "p.yaml")])
    assert compiled.exit_code == 2 and "GPUs" in compiled.output, compiled.output
    assert not (tmp_path / "p.yaml").exists()
    assert check_profile(load_profile("local")) is None  # nothing to plan on CPU


def test_a_local_profile_has_no_plan():
    result = plan_cli("--profile", "local")
    assert result.exit_code == 2 and "local" in result.output
