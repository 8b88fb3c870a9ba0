"""`mazerl pipeline rehearse`: the compiled HyperPod DAG run on this machine (kfp.local, a local Kubernetes
API whose KubeRay runs the RayJob's entrypoint on a local Ray with vLLM's CPU build, moto for S3 and
SageMaker, FSx a folder), changing only the model, device, dtypes and counts.

The two whole rehearsals run in the vLLM build's venv (MAZERL_VLLM_PYTHON), which holds what the trainer
image holds (vLLM, Ray, kfp, moto)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from conftest import assert_clear_error
from mazerl.cli import app
from mazerl.profiles import load_profile
from mazerl.rehearsal.kube_api import ClusterState, K8sAPIServer, rayjob_schema_errors
from mazerl.rehearsal.model import build_rehearsal_model, shipped_config
from mazerl.rehearsal.run import ALLOWED_JOB_KEYS, RehearsalError, config_differences, rehearse

VLLM_PYTHON = os.environ.get("MAZERL_VLLM_PYTHON")
needs_vllm = pytest.mark.skipif(not VLLM_PYTHON, reason="MAZERL_VLLM_PYTHON (make vllm-env) is not set")
runner = CliRunner()


def _rehearse(out: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run([VLLM_PYTHON, "-m", "mazerl", "pipeline", "rehearse", "--profile", "hyperpod-p5", "--out", str(out),
                           *extra], capture_output=True, text=True, timeout=2400, cwd=out.parent)
    record = json.loads((out / "rehearsal.json").read_text()) if (out / "rehearsal.json").is_file() else {}
    return proc, record


def _metrics(out: Path) -> list[dict]:
    path = next(out.glob("fsx/mazerl/runs/*/grpo/metrics.jsonl"))
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---- the whole rehearsal -------------------------------------------------------------------------------------------
@pytest.mark.slow
@needs_vllm
def test_the_p5_rehearsal_runs_the_shipped_dag_end_to_end(tmp_path):
    out = tmp_path / "rehearsal"
    proc, r = _rehearse(out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # nothing differs from what ships but the substitutions, and each says why
    assert r["unexpected_differences"] == {}
    job_keys = {s["setting"][len("job."):] for s in r["substitutions"] if s["setting"].startswith("job.")}
    assert job_keys <= ALLOWED_JOB_KEYS and "policy.model" in job_keys and "distributed.ranks" in job_keys
    assert all(s["why"] and s["why"] != "NOT A SUBSTITUTION" for s in r["substitutions"])
    # what ran as shipped: the vLLM engine, colocated, full history, free-form replies up to 1,024 tokens
    assert r["engine"] == "vllm" and r["placement"]["placement"] == "colocated" and r["placement"]["backend"] == "ray"
    assert r["history"] == {"turns": None, "images": None}
    entry = r["entrypoint"]
    assert entry[:4] == ["-m", "mazerl", "train", "grpo"] and "--set" in entry
    # the manifest the launcher created, as KubeRay's CRD allows it, with the shipped 8-GPU worker group
    manifest = yaml.safe_load(Path(r["rayjob_manifest"]).read_text())
    assert r["rayjob_schema_errors"] == [] and rayjob_schema_errors(manifest) == []
    worker = manifest["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] in (8, "8")
    assert manifest["metadata"]["ownerReferences"][0]["kind"] == "Pod"  # the launcher pod owns it
    # the plan at true scale (8B on p5)
    assert r["plan"]["fits"] and r["plan"]["parameters"]["total"] > 8e9 and r["plan"]["gpus"] == 8
    # training: every step updated the policy on both ranks and synced it into the engines
    metrics = [m for m in _metrics(out) if m["step"] > 0]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["optimizer_steps"] >= 1 and m["update/rank0_samples"] > 0 and m["update/rank1_samples"] > 0 for m in metrics)
    assert all(m["weight_sync/bytes"] > 0 for m in metrics) and r["weight_sync"]["mode"] == "direct"
    # compared, promoted and registered in SageMaker's Model Registry; nothing left running
    o = r["outcome"]
    assert o["compared"] and o["decision"] is True and o["registered"] and o["model_packages"]
    assert o["rayjobs_left"] == 0 and o["processes_left"] == [] and o["pipeline_error"] is None
    assert "rehearsal: " in proc.stdout


@pytest.mark.slow
@needs_vllm
def test_a_rehearsal_terminated_after_step_1_leaves_no_rayjob_and_nothing_running(tmp_path):
    out = tmp_path / "rehearsal"
    proc, r = _rehearse(out, "--cancel-after-step", "1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    o = r["outcome"]
    assert o["terminated_after_step"] == 1 and o["pipeline_error"]
    assert o["rayjobs_left"] == 0 and o["processes_left"] == []
    assert not o["compared"] and not o["registered"]
    assert 1 <= o["steps_trained"] < 2  # stopped before the run's last step
    # the launcher deleted its own RayJob on SIGTERM (nothing was left for the garbage collector)
    assert o["rayjobs_collected_with_the_pod"] == 0
    train_log = next(out.glob("kfp/runs/*/train-grpo/task.log")).read_text()
    assert "deleted" in train_log.lower()


# ---- its parts -----------------------------------------------------------------------------------------------------
def test_the_rehearsal_model_keeps_the_real_models_proportions(tmp_path):
    from transformers import AutoConfig, AutoProcessor

    real = shipped_config("Qwen3-VL-8B-Instruct")
    path = build_rehearsal_model("Qwen3-VL-8B-Instruct", tmp_path / "m")
    cfg = AutoConfig.from_pretrained(path)
    t, v, rt, rv = cfg.text_config, cfg.vision_config, real["text_config"], real["vision_config"]
    assert t.num_attention_heads // t.num_key_value_heads == rt["num_attention_heads"] // rt["num_key_value_heads"]
    assert t.intermediate_size / t.hidden_size == pytest.approx(rt["intermediate_size"] / rt["hidden_size"])
    assert t.num_attention_heads * t.head_dim == t.hidden_size
    assert (v.patch_size, v.spatial_merge_size, v.temporal_patch_size) == (rv["patch_size"], rv["spatial_merge_size"],
                                                                           rv["temporal_patch_size"])
    assert v.hidden_size // v.num_heads == rv["hidden_size"] // rv["num_heads"] and v.out_hidden_size == t.hidden_size
    assert len(v.deepstack_visual_indexes) == len(rv["deepstack_visual_indexes"])
    # its images are the real model's number of tokens: the vLLM per-prompt limits are the real ones
    from mazerl.cluster.plan import image_tokens_counter

    real_dir = str(Path(__import__("mazerl").__file__).parent / "assets" / "configs" / "Qwen3-VL-8B-Instruct")
    for h, w in ((224, 224), (448, 320), (512, 512)):
        assert image_tokens_counter(str(path))(h, w) == image_tokens_counter(real_dir)(h, w)
    assert AutoProcessor.from_pretrained(path).image_processor.merge_size == rv["spatial_merge_size"]


def test_the_rehearsal_model_replies_like_a_random_mover(tmp_path):
    """Sampled free-form, its replies are mostly well-formed random moves (so episodes move through mazes)."""
    import torch

    from mazerl.envs.actions import parse_action
    from mazerl.policy.loading import load_policy

    path = build_rehearsal_model("Qwen3-VL-8B-Instruct", tmp_path / "m")
    policy = load_policy(path)
    tok = policy.processor.tokenizer
    ids = tok.apply_chat_template([{"role": "user", "content": "Where next?"}], add_generation_prompt=True, return_tensors="pt")
    ids = ids if torch.is_tensor(ids) else ids["input_ids"]
    actions = []
    for seed in range(16):
        torch.manual_seed(seed)
        out = policy.model.generate(ids, do_sample=True, temperature=1.0, max_new_tokens=8)
        actions.append(parse_action(tok.decode(out[0, ids.shape[1]:])))
    moves = [a for a in actions if a is not None]
    assert len(moves) >= 12 and len(set(moves)) >= 3, actions


def test_a_job_config_difference_that_is_not_a_substitution_is_named(tmp_path):
    fsx = tmp_path / "fsx"
    shipped = {"policy": {"model": "Qwen/Qwen3-VL-8B-Instruct", "max_new_tokens": 1024}, "train_data": "/fsx/r/mazes/train.parquet",
               "steps": 100}
    ran = {"policy": {"model": str(tmp_path / "model"), "max_new_tokens": 16}, "train_data": f"{fsx}/r/mazes/train.parquet",
           "steps": 2}
    diff = config_differences(shipped, ran, fsx, "/fsx")
    assert set(diff) == {"policy.model", "policy.max_new_tokens", "steps"}  # FSx paths compare relative to the mount
    assert set(diff) - ALLOWED_JOB_KEYS == {"policy.max_new_tokens"}


def test_rehearsing_a_profile_that_is_not_a_cluster_profile_is_a_clear_error(tmp_path):
    result = runner.invoke(app, ["pipeline", "rehearse", "--profile", "local", "--out", str(tmp_path / "r")])
    assert_clear_error(result, "not a cluster profile")
    assert not (tmp_path / "r").exists()


def test_a_rehearsal_into_a_folder_with_files_refuses_and_keeps_them(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(RehearsalError, match="not an empty folder"):
        rehearse(load_profile("hyperpod-p5"), tmp_path)
    assert (tmp_path / "keep.txt").read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


def test_cancel_after_step_0_is_refused(tmp_path):
    with pytest.raises(RehearsalError, match="--cancel-after-step 0"):
        rehearse(load_profile("hyperpod-p5"), tmp_path / "r", cancel_after_step=0)


def test_a_python_without_vllm_is_told_which_venv_has_it(tmp_path):
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("this Python has vLLM")
    result = runner.invoke(app, ["pipeline", "rehearse", "--profile", "hyperpod-p5", "--out", str(tmp_path / "r")])
    assert_clear_error(result, "vllm", "make vllm-env")
    assert not (tmp_path / "r").exists()


# ---- the local Kubernetes API and KubeRay ----------------------------------------------------------------------------
def test_the_local_api_server_refuses_a_rayjob_the_crd_does_not_allow():
    from kubernetes.client.rest import ApiException

    from mazerl.cluster.launcher import custom_objects_api

    bad = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "x"},
           "spec": {"entrypoint": "python -m mazerl", "shutdownAfterJobFinishes": "yes"}}
    with K8sAPIServer(ClusterState(validate=True)) as srv:
        api = custom_objects_api(host=srv.url)
        with pytest.raises(ApiException) as err:
            api.create_namespaced_custom_object("ray.io", "v1", "ns", "rayjobs", bad)
        assert err.value.status == 422 and "shutdownAfterJobFinishes" in err.value.body
        assert srv.state.jobs == {}


def test_deleting_a_rayjob_stops_its_entrypoint_and_everything_it_started(tmp_path):
    """KubeRay deletes the Ray cluster with the job: the local KubeRay stops the entrypoint's whole process tree."""
    import threading
    import time

    import psutil

    from mazerl.rehearsal.kuberay import LocalKubeRay

    kuberay = LocalKubeRay({}, tmp_path)
    # an 'entrypoint' that starts a child and waits, as `mazerl train grpo` starts Ray
    script = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
              "time.sleep(600)")
    kuberay.command = lambda job: [sys.executable, "-c", script]
    job = {"metadata": {"name": "j"}, "spec": {"entrypoint": "python -m mazerl", "rayClusterSpec": {
        "headGroupSpec": {"template": {"spec": {"containers": [{"env": [{"name": "A", "value": "1"}]}]}}}}}}
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(r=kuberay(job)))
    thread.start()
    deadline = time.time() + 60
    while time.time() < deadline and len(kuberay.running()) < 2:
        time.sleep(0.2)
    pids = kuberay.running()
    assert len(pids) == 2
    kuberay.on_delete(job)
    thread.join(60)
    assert result["r"][0] is False and "deleted" in result["r"][1]
    assert kuberay.running() == [] and not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                                               for p in pids)
