"""The vLLM engine on CPU, for real: its CPU build runs in a venv of its own (`make vllm-env`), so one
script (tests/vllm_checks.py) runs there and these tests assert on what it recorded.

Also here, in this venv: asking for vLLM where it is not installed, and the LoRA weight merge that
engines with their own copy of the weights load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def vllm_python() -> str:
    """The vLLM venv's Python: $MAZERL_VLLM_PYTHON (make test sets it) or the repository's .venv-vllm.
    Missing, the test fails (it is not skipped): run `make vllm-env`."""
    path = os.environ.get("MAZERL_VLLM_PYTHON") or str(REPO / ".venv-vllm" / "bin" / "python")
    if not Path(path).exists():
        pytest.fail(f"no vLLM venv at {path}: build it with `make vllm-env` (make test does)")
    return path


@pytest.fixture(scope="module")
def checks(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("vllm")
    out = work / "checks.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIRTUAL_ENV")}
    proc = subprocess.run([vllm_python(), str(REPO / "tests" / "vllm_checks.py"), str(out), str(work)],
                          cwd=work, env=env, capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        pytest.fail(f"tests/vllm_checks.py failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text())


def test_greedy_multiturn_with_images_matches_hf(checks):
    hf, vllm = checks["greedy_hf"], checks["greedy_vllm"]
    assert len(hf) == len(vllm) == 6
    assert any(len(t["replies"]) > 1 for t in hf), "no episode reached a second turn: not a multi-turn check"
    for a, b in zip(hf, vllm):
        assert a["replies"] == b["replies"]
        for la, lb in zip(a["logprobs"], b["logprobs"]):
            assert la == pytest.approx(lb, abs=2e-3)


def test_action_grammar_matches_hf(checks):
    for a, b in zip(checks["action_hf"], checks["action_vllm"]):
        assert a["replies"] == b["replies"]
        for la, lb in zip(a["logprobs"], b["logprobs"]):
            assert la == pytest.approx(lb, abs=2e-3)


def test_seeded_sampling_is_reproducible_and_batch_independent(checks):
    assert checks["sampled_a"] == checks["sampled_b"]
    assert checks["sampled_a"] == checks["sampled_alone"]
    assert checks["sampled_a"] != checks["sampled_other_seeds"], "other seeds drew the very same tokens: seeds unused?"
    banned = set(checks["banned_ids"])
    assert not banned & {t for ids in checks["sampled_a"] + checks["sampled_other_seeds"] for t in ids}
    # HFEngine keeps the same promise
    assert checks["sampled_hf_a"] == checks["sampled_hf_alone"]


def test_after_a_weight_reload_outputs_are_the_new_weights(checks):
    assert checks["reloaded_vllm"] != checks["old_weights_hf"], "the new weights behave like the old: not a test"
    for a, b in zip(checks["reloaded_hf"], checks["reloaded_vllm"]):
        assert a["replies"] == b["replies"]
        assert b["version"] == 1


def test_a_model_vllm_cpu_would_serve_wrongly_is_refused(checks):
    msg = checks["tiny_base_refused"]
    assert msg is not None and "head_dim 48" in msg and "engine: hf" in msg


def test_tokens_per_second_are_measured(checks):
    assert checks["tokens_per_s_hf"] > 0 and checks["tokens_per_s_vllm"] > 0


def test_vllm_engine_where_vllm_is_missing_is_a_clear_error(tmp_path, small_mazes):
    """This venv has no vLLM: `train grpo` with engine vllm stops before any work, naming the fix."""
    import importlib.util

    assert importlib.util.find_spec("vllm") is None, "this check needs a Python without vLLM"
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "mazerl", "train", "grpo", "--config", "tiny-grpo",
         "--set", f"train_data={small_mazes / 'train.parquet'}", "--set", f"output_dir={out}",
         "--set", "policy.engine=vllm"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "vLLM is not installed" in proc.stderr and "make vllm-env" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (out / "checkpoints").exists()


def test_lora_weights_merge_like_peft(tiny_model_dir):
    """serving_weights turns a LoRA model's state dict into the plain merged weights peft computes."""
    import copy

    import torch

    from conftest import lora_model
    from mazerl.policy.trainable import serving_weights

    model, lora = lora_model(tiny_model_dir)
    merged = serving_weights(model.state_dict(), lora)
    expected = copy.deepcopy(model).merge_and_unload().state_dict()
    assert set(merged) == set(expected)
    changed = 0
    for k, v in expected.items():
        torch.testing.assert_close(merged[k], v, rtol=0, atol=1e-6)
        changed += "q_proj.weight" in k and not torch.equal(v, model.state_dict()[f"base_model.model.{k[:-len('.weight')]}.base_layer.weight"])
    assert changed > 0
    with pytest.raises(ValueError, match="LoRA"):
        serving_weights(model.state_dict(), None)


@pytest.mark.parametrize("mode", ["grpo", "grpo-ray"])
def test_grpo_with_the_vllm_engine_reloads_it_after_every_update(tmp_path, mode):
    """`mazerl train grpo` with policy.engine vllm, in the vLLM venv: 2 updates, each followed by a
    weight reload; the trainer's version check (no lag allowed) passed every step. grpo-ray: the
    engine lives in a Ray rollout actor and receives the weights over the broadcast group."""
    out = tmp_path / "grpo.json"
    proc = subprocess.run([vllm_python(), str(REPO / "tests" / "vllm_checks.py"), str(out), str(tmp_path), mode],
                          cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["returncode"] == 0, result["stderr"]
    assert [m["step"] for m in result["metrics"]] == [1, 2]
    assert all(m["weights_lag"] == 0 and m["time/weight_sync"] > 0 for m in result["metrics"])
    if mode == "grpo-ray":
        assert [m["rollout_versions"] for m in result["metrics"]] == [[0], [1]]
    assert result["final"]
