"""`mazerl train grpo --backend ray` for real on CPU: a local Ray, 2 FSDP2 training ranks (gloo) and
a rollout actor, weight sync straight from the ranks, sharded checkpoints, a consolidated model."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import yaml
from pytest import approx

from mazerl.metrics import read_metrics
from mazerl.rl.checkpoint import verify


def _config(small_mazes, tmp_path, **over):
    out = tmp_path / "run"
    cfg = {"policy": {"model": "tiny-base"}, "train_data": str(small_mazes / "train.parquet"), "output_dir": str(out),
           "steps": 3, "mazes_per_step": 2, "group_size": 2, "max_turns": 3, "micro_batch": 8, "eval_every": 0,
           "checkpoint_every": 2, "optim": {"lr": 1e-4}, "env": {"progress_reward": 0.1},
           "distributed": {"ranks": 2, "rollout_workers": 1, "cpus_per_actor": 0.5}, **over}
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, out


def _train(path, *extra, env_extra=None):
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": "", **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "mazerl.cli", "train", "grpo", "--config", str(path), "--backend", "ray", *extra],
                          capture_output=True, text=True, env=env, timeout=600)


def test_two_ranks_and_two_rollout_actors_through_the_cli(small_mazes, tmp_path):
    # the KL reference is sharded like the policy; each rollout actor plays one of the step's 2 mazes;
    # the periodic greedy evaluation runs as in process (step 0, then every 2 steps)
    # the schedule is fitted to a deadline far off on every rank: it stays the steps' cosine
    path, out = _config(small_mazes, tmp_path, kl_coef=0.01, eval_every=2, eval_data=str(small_mazes / "heldout.parquet"),
                        eval_mazes=2, distributed={"ranks": 2, "rollout_workers": 2, "cpus_per_actor": 0.5},
                        max_minutes=60, fit_schedule_to_max_minutes=True,
                        optim={"lr": 1e-4, "schedule": "cosine", "min_lr_ratio": 0.1})
    result = _train(path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    everything = read_metrics(out / "metrics.jsonl")
    assert [(r["step"], r.get("eval/mazes")) for r in everything] == [(0, 2), (1, None), (2, 2), (3, None)]
    log = everything[1:]
    # every trajectory was sampled with the weights after the previous update
    assert [r["rollout_versions"] for r in log] == [[0], [1], [2]]
    assert all(r["weights_lag"] == 0 and r["time/weight_sync"] > 0 for r in log)
    assert all({"time/rank0_update", "time/rank1_update", "time/rollout_worker0", "time/rollout_worker1"} <= r.keys() for r in log)
    assert log[0]["kl"] == 0.0 and log[-1]["kl"] > 0.0  # step 1 trains from the reference weights; then they part
    assert [r["lr_schedule_steps"] for r in log] == [3, 3, 3]
    assert log[-1]["lr"] == approx(1e-5) and log[0]["lr"] == approx(1e-4 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 3))))
    for step in ("step-00000002", "step-00000003"):
        assert verify(out / "checkpoints" / step) is None
        assert json.loads((out / "checkpoints" / step / "state.json").read_text())["world_size"] == 2
    from transformers import AutoModelForImageTextToText

    final = AutoModelForImageTextToText.from_pretrained(out / "final")
    assert (out / "final" / "mazerl_policy.json").is_file() and sum(p.numel() for p in final.parameters()) > 1e6
    # a fresh start over this run is refused, as in process, before any work
    again = _train(path, "--resume", "never")
    assert again.returncode == 2 and "holds an earlier run" in " ".join(again.stderr.split()), again.stderr[-1500:]
    assert len(read_metrics(out / "metrics.jsonl")) == 4


def test_a_dead_rollout_actor_fails_the_step_and_a_resume_on_fewer_ranks_redoes_it(small_mazes, tmp_path):
    """Step 2's rollout actor dies: nothing is trained on a partial batch. The run is resumed with 1
    training rank instead of 2 (a smaller cluster): the 2-rank sharded checkpoint of step 1 loads."""
    from mazerl.distributed.ray_grpo import KILL_ROLLOUT_AT_STEP_ENV

    path, out = _config(small_mazes, tmp_path, checkpoint_every=1)
    died = _train(path, env_extra={KILL_ROLLOUT_AT_STEP_ENV: "2"})
    assert died.returncode == 2, died.stdout[-2000:] + died.stderr[-2000:]
    assert "step 2: a rollout worker died" in " ".join(died.stderr.split()) and "Traceback" not in died.stderr
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1]  # nothing trained on a partial batch
    assert not (out / "checkpoints" / "step-00000002").exists()
    assert json.loads((out / "checkpoints" / "step-00000001" / "state.json").read_text())["world_size"] == 2
    path, _ = _config(small_mazes, tmp_path, checkpoint_every=1, distributed={"ranks": 1, "rollout_workers": 1, "cpus_per_actor": 0.5})
    resumed = _train(path)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    log = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in log] == [1, 2, 3] and [r["rollout_versions"] for r in log] == [[0], [1], [2]]
    assert "time/rank0_update" in log[-1] and "time/rank1_update" not in log[-1]
    state = json.loads((out / "checkpoints" / "step-00000003" / "state.json").read_text())
    assert state["world_size"] == 1 and verify(out / "checkpoints" / "step-00000003") is None


def test_more_ranks_than_cpus_is_refused_before_any_work(small_mazes, tmp_path):
    path, out = _config(small_mazes, tmp_path, distributed={"ranks": 4, "rollout_workers": 1, "cpus_per_actor": float(os.cpu_count() or 1)})
    result = _train(path)
    assert result.returncode == 2 and "need" in result.stderr and "CPUs" in result.stderr, result.stderr[-2000:]
    assert not (out / "metrics.jsonl").exists()
    # GPUs asked of a cluster that has none (this machine): refused the same way, before any work
    path, out = _config(small_mazes, tmp_path, distributed={"ranks": 1, "rollout_workers": 1, "gpus_per_rank": 1})
    result = _train(path)
    message = " ".join(result.stderr.split())
    assert result.returncode == 2 and "need" in message and "1 GPUs; this Ray cluster has" in message and "0 GPUs" in message, message[-2000:]
    assert not (out / "metrics.jsonl").exists()


def test_bad_distributed_settings_are_refused_up_front(small_mazes, tmp_path):
    import pytest

    from mazerl.distributed.ray_grpo import RayBackendError, check_ray_address

    with pytest.raises(RayBackendError, match="cannot reach the Ray cluster"):
        check_ray_address("127.0.0.1:1", timeout_s=2)
    with pytest.raises(RayBackendError, match="not HOST:PORT"):
        check_ray_address("somewhere")
    path, _ = _config(small_mazes, tmp_path, distributed={"ranks": 3, "rollout_workers": 1})
    result = _train(path)
    assert result.returncode == 2 and "does not divide" in result.stderr, result.stderr[-1500:]
    unreachable = _train(_config(small_mazes, tmp_path)[0], env_extra={"RAY_ADDRESS": "127.0.0.1:1"})
    assert unreachable.returncode == 2 and "cannot reach the Ray cluster" in unreachable.stderr, unreachable.stderr[-1500:]


def test_colocated_placement_with_lora_through_the_cli(small_mazes, tmp_path):
    """Colocated: each rollout actor shares its rank's placement-group bundle. With LoRA the rollout
    actor gets the merged weights (plain keys) after every update."""
    path, out = _config(small_mazes, tmp_path, steps=2, lora={"r": 4, "alpha": 8},
                        distributed={"ranks": 1, "rollout_workers": 1, "cpus_per_actor": 1, "placement": "colocated"})
    result = _train(path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    log = read_metrics(out / "metrics.jsonl")
    assert [r["rollout_versions"] for r in log] == [[0], [1]]
    assert all(r["weights_lag"] == 0 for r in log)


def test_placement_settings_are_checked_before_any_work(small_mazes, tmp_path):
    path, out = _config(small_mazes, tmp_path, distributed={"ranks": 2, "rollout_workers": 1, "placement": "colocated"})
    result = _train(path)
    assert result.returncode == 2
    assert "rollout_workers = ranks (2)" in " ".join(result.stderr.split()) and "Traceback" not in result.stderr
    assert not out.exists()


def test_the_ray_metrics_export_serves_mazerl_training_metrics(small_mazes, tmp_path):
    """During a local Ray run, Ray's metrics endpoint (Prometheus text, on 127.0.0.1) serves the
    driver's mazerl_* gauges beside Ray's own metrics."""
    import time
    import urllib.request

    from mazerl.distributed.group import free_port
    from mazerl.distributed.ray_grpo import METRICS_PORT_ENV

    port = free_port()
    path, out = _config(small_mazes, tmp_path, steps=16, checkpoint_every=100,
                        distributed={"ranks": 1, "rollout_workers": 1, "cpus_per_actor": 0.5})
    # Ray exports metrics every 10 s by default: every 0.5 s here, so a short run is scraped before it ends
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": "", METRICS_PORT_ENV: str(port), "MAZERL_RUN_ID": "run-7",
           "RAY_metrics_report_interval_ms": "500"}
    proc = subprocess.Popen([sys.executable, "-m", "mazerl", "train", "grpo", "--config", str(path), "--backend", "ray"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    scraped, deadline = "", time.monotonic() + 500
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                scraped = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                scraped = ""
            if "ray_mazerl_success_rate{" in scraped and "ray_mazerl_step{" in scraped:
                break
            time.sleep(1)
    finally:
        stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-3000:]
    lines = [line for line in scraped.splitlines() if line.startswith("ray_mazerl_")]
    assert any(line.startswith("ray_mazerl_success_rate{") and 'run="run-7"' in line for line in lines), scraped[-2000:]
    assert any(line.startswith("ray_mazerl_time_rollout{") for line in lines)
    assert any(line.startswith("ray_") and not line.startswith("ray_mazerl_") for line in scraped.splitlines())  # Ray's own


def test_weights_by_broadcast_group_through_the_cli(small_mazes, tmp_path):
    """distributed.weight_sync: broadcast (gloo here; NCCL between GPUs): 2 ranks gather, rank 0
    broadcasts to the rollout actor, which loads what it receives; versions as with direct sync."""
    path, out = _config(small_mazes, tmp_path, steps=2,
                        distributed={"ranks": 2, "rollout_workers": 1, "cpus_per_actor": 0.5, "weight_sync": "broadcast"})
    result = _train(path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    log = read_metrics(out / "metrics.jsonl")
    assert [r["rollout_versions"] for r in log] == [[0], [1]]
    assert all(r["weights_lag"] == 0 and r["time/weight_sync"] > 0 for r in log)
