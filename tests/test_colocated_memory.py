"""Colocated GPU memory discipline (issue #33, item 4): vLLM's share derived from the capacity plan (or a share
set explicitly checked against it), the training ranks' caches emptied between the phases of a step (the phase
order read from the ranks' and rollout actors' own logs in a real Ray run), and the final model written from the
sharded state tensor by tensor, without opening a second model, atomically on a retry."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from mazerl.cli import app
from mazerl.cluster.plan import SHARE_MARGIN, PlanError, resolve_memory_share
from mazerl.mazes.dataset_io import read_split
from mazerl.policy.config import PolicyConfig, VLLMSettings
from mazerl.policy.export import INDEX_NAME, read_model_tensors, save_trained_model
from mazerl.policy.trainable import save_model_dir, serving_weights
from mazerl.rollout.factory import open_policy
from mazerl.rl.config import GRPOConfig

GiB = 2**30


def plan_json(*sets: str) -> tuple[int, dict | None, str]:
    args = ["cluster", "plan", "--profile", "hyperpod-p5", "--json"]
    for s in sets:
        args += ["--set", s]
    result = CliRunner().invoke(app, args)
    try:
        return result.exit_code, json.loads(result.stdout), result.output
    except ValueError:
        return result.exit_code, None, result.output


# ---- 1. vLLM's share from the plan ---------------------------------------------------------------------------
def test_an_unset_share_is_optional_and_an_engine_alone_takes_the_sole_gpu_share():
    assert VLLMSettings().gpu_memory_utilization is None
    assert VLLMSettings.SOLE_GPU_SHARE == 0.85
    with pytest.raises(ValueError):
        VLLMSettings(gpu_memory_utilization=0.0)


def test_unset_colocated_share_is_what_the_rank_leaves_beside_the_sleeping_engine_less_the_margin():
    code, plan, out = plan_json("policy.vllm.gpu_memory_utilization=null")
    assert code == 0 and plan["fits"], out
    share, terms, gpu = plan["vllm_memory_share"], plan["per_gpu_bytes"], plan["gpu_bytes"]
    # sleep mode: beside the engine the rank holds its training state; its gradients are dropped after the update
    rank = terms["master_weights"] + terms["optimizer"] + terms["reference"] + terms["reserve"]
    assert share["derived"] is True and share["rank_bytes_beside_engine"] == rank
    assert share["gpu_memory_utilization"] == math.floor(((gpu - rank) / gpu - SHARE_MARGIN) * 100 + 1e-9) / 100
    assert share["largest"] == math.floor((gpu - rank) / gpu * 100 + 1e-9) / 100
    assert 0.5 < share["gpu_memory_utilization"] < share["largest"]
    # the KV cache is what the derived share leaves beyond the engine's weights; the rollout peak keeps the margin
    assert terms["kv_cache"] == int(share["gpu_memory_utilization"] * gpu) - terms["vllm_weights"]
    assert plan["phases"]["rollout"] <= gpu * (1 - SHARE_MARGIN) + 1
    text = CliRunner().invoke(app, ["cluster", "plan", "--profile", "hyperpod-p5", "--set",
                                    "policy.vllm.gpu_memory_utilization=null"])
    assert f"gpu_memory_utilization): {share['gpu_memory_utilization']:g} (derived" in text.stdout


def test_the_shipped_share_is_kept_and_reported_with_the_most_that_fits():
    code, plan, out = plan_json()
    assert code == 0, out
    assert plan["vllm_memory_share"]["gpu_memory_utilization"] == 0.6 and plan["vllm_memory_share"]["derived"] is False
    # the fields the plan printed before are all still there
    assert {"per_gpu_bytes", "phases", "vllm_limits", "rollout_sequences_at_full_length", "weight_sync_bytes_per_step",
            "checkpoint_bytes", "problems", "fits"} <= plan.keys()


def test_a_share_set_larger_than_the_rank_leaves_is_refused_naming_the_field_and_the_number():
    _, derived, _ = plan_json("policy.vllm.gpu_memory_utilization=null")
    largest = derived["vllm_memory_share"]["largest"]
    code, plan, out = plan_json(f"policy.vllm.gpu_memory_utilization={largest + 0.02:g}")
    assert code == 2 and plan["fits"] is False
    message = " ".join(out.split())
    assert f"policy.vllm.gpu_memory_utilization = {largest + 0.02:g} is too large" in message
    assert f"needs <= {largest:g}" in message
    assert plan_json(f"policy.vllm.gpu_memory_utilization={largest:g}")[0] == 0  # the largest itself fits


def test_without_sleep_mode_the_share_is_derived_beside_the_whole_update():
    code, plan, out = plan_json("policy.vllm.gpu_memory_utilization=null", "policy.vllm.enable_sleep_mode=false")
    terms, gpu = plan["per_gpu_bytes"], plan["gpu_bytes"]
    share = plan["vllm_memory_share"]
    update_without_engine = plan["phases"]["update"] - terms["vllm_weights"] - terms["kv_cache"]
    assert share["rank_bytes_beside_engine"] == update_without_engine
    assert share["gpu_memory_utilization"] == math.floor(((gpu - update_without_engine) / gpu - SHARE_MARGIN) * 100 + 1e-9) / 100
    assert plan["phases"]["update"] <= gpu  # the engine awake through the update still fits beside it
    # at 8B the share left (~0.23) holds no full-length prompt: refused, naming the share as derived
    assert code == 2 and "(derived: what the training rank leaves)" in " ".join(out.split())


def _ray_vllm_config(small_mazes, tmp_path, model: str = "tiny-base", **vllm) -> GRPOConfig:
    return GRPOConfig.model_validate({
        "policy": {"model": model, "engine": "vllm", "vllm": vllm}, "train_data": str(small_mazes / "train.parquet"),
        "output_dir": str(tmp_path / "run"), "max_turns": 3, "kl_coef": 0.0,
        "distributed": {"backend": "ray", "ranks": 2, "rollout_workers": 2, "placement": "colocated",
                        "gpus_per_rank": 1.0}})


def test_the_driver_derives_the_share_from_the_gpu_its_ranks_measure(small_mazes, tmp_path):
    train = read_split(small_mazes / "train.parquet")
    gpu = 8 * GiB
    resolved = resolve_memory_share(_ray_vllm_config(small_mazes, tmp_path, enable_sleep_mode=True), train, gpu)
    share = resolved.policy.vllm.gpu_memory_utilization
    # tiny-base: the 3 GiB runtime reserve dominates what the rank holds
    assert 0.5 < share <= math.floor((5 / 8 - SHARE_MARGIN) * 100) / 100
    explicit = _ray_vllm_config(small_mazes, tmp_path, enable_sleep_mode=True, gpu_memory_utilization=0.5)
    assert resolve_memory_share(explicit, train, gpu).policy.vllm.gpu_memory_utilization == 0.5  # kept
    too_large = _ray_vllm_config(small_mazes, tmp_path, enable_sleep_mode=True, gpu_memory_utilization=0.9)
    with pytest.raises(PlanError, match=r"policy.vllm.gpu_memory_utilization = 0.9 is too large.*needs <= 0\.6"):
        resolve_memory_share(too_large, train, gpu)
    with pytest.raises(PlanError, match="leaves no share for the colocated vLLM engine"):
        resolve_memory_share(_ray_vllm_config(small_mazes, tmp_path), train, 3 * GiB)
    # a model whose architecture cannot be read here: a share set is taken as it is, an unset one is refused
    unknown = tmp_path / "no-config"
    unknown.mkdir()
    kept = _ray_vllm_config(small_mazes, tmp_path, model=str(unknown), gpu_memory_utilization=0.5)
    assert resolve_memory_share(kept, train, gpu) is kept
    with pytest.raises(PlanError, match="or set policy.vllm.gpu_memory_utilization"):
        resolve_memory_share(_ray_vllm_config(small_mazes, tmp_path, model=str(unknown)), train, gpu)


# ---- 2. caches emptied between phases --------------------------------------------------------------------------
def test_release_drops_the_gradients_the_update_left():
    from mazerl.distributed.memory import release_cached_memory

    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    optimizer.step()
    assert all(p.grad is not None for p in model.parameters())
    released = release_cached_memory(optimizer)
    assert released["gradients_dropped"] == 2 and all(p.grad is None for p in model.parameters())
    assert len(optimizer.state) == 2  # AdamW's moments stay: the next update needs them


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA caching allocator needs a GPU")
def test_release_gives_the_cuda_allocator_s_free_blocks_back():
    from mazerl.distributed.memory import release_cached_memory

    block = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    del block
    assert torch.cuda.memory_reserved() >= 256 * 2**20  # freed, but still cached by the allocator
    released = release_cached_memory()
    assert released["reserved_before"] >= 256 * 2**20
    assert released["reserved_after"] <= released["reserved_before"] - 256 * 2**20


def _phase_run(config: str, events_file: str) -> None:
    """A real RayGRPO run whose actors' phase logs are read before they are shut down."""
    from mazerl.config import load_config
    from mazerl.distributed.ray_grpo import RayGRPO

    class Recording(RayGRPO):
        def shutdown(self):
            logs = self.ray.get([a.events.remote() for a in [*self.ranks, *self.rollouts]])
            for k, log in enumerate(logs[len(self.ranks):]):
                for e in log:
                    e["actor"] = f"rollout{k}"
            Path(events_file).write_text(json.dumps([e for log in logs for e in log]))
            super().shutdown()

    Recording(load_config(GRPOConfig, config)).run(resume="never")


def test_a_ray_run_keeps_the_phase_order_rollout_sleep_update_release_wake_sync(small_mazes, tmp_path):
    import subprocess
    import sys

    cfg = {"policy": {"model": "tiny-base"}, "train_data": str(small_mazes / "train.parquet"),
           "output_dir": str(tmp_path / "run"), "steps": 2, "mazes_per_step": 2, "group_size": 2, "max_turns": 3,
           "micro_batch": 8, "eval_every": 0, "checkpoint_every": 2, "optim": {"lr": 1e-4},
           "env": {"progress_reward": 0.1},
           "distributed": {"backend": "ray", "ranks": 2, "rollout_workers": 2, "placement": "colocated",
                           "cpus_per_actor": 0.5}}
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(cfg))
    events = tmp_path / "events.json"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": ""}
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            f"from test_colocated_memory import _phase_run; _phase_run({str(path)!r}, {str(events)!r})")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    timeline = sorted(json.loads(events.read_text()), key=lambda e: e["t_ns"])  # one node: one monotonic clock
    ranks, rollouts = ["rank0", "rank1"], ["rollout0", "rollout1"]

    def when(actor: str, event: str, n: int, **match) -> int:
        hits = [e["t_ns"] for e in timeline if e["actor"] == actor and e["event"] == event
                and all(e.get(k) == v for k, v in match.items())]
        return hits[n]

    for step in (1, 2):
        i = step - 1
        rollout_done = max(when(w, "collect_end", i) for w in rollouts)
        slept = [when(w, "sleep", i) for w in rollouts]
        update_start = min(when(r, "update_start", 0, step=step) for r in ranks)
        update_end = max(when(r, "update_end", 0, step=step) for r in ranks)
        # the first release after a sync is the one after the run's first sync (before step 1)
        released = [when(r, "release", i, after="update") for r in ranks]
        woke = [when(w, "wake", i) for w in rollouts]
        synced_then_released = [when(r, "release", i + 1, after="sync") for r in ranks]
        assert rollout_done < min(slept) and max(slept) < update_start
        assert update_end < min(released) and max(released) < min(woke)
        assert max(woke) < min(synced_then_released)
    # after an update that trained (a step whose groups all tie trains on nothing) the ranks dropped their gradients
    dropped = [e["gradients_dropped"] for e in timeline if e["event"] == "release" and e["after"] == "update"]
    assert len(dropped) == 4 and max(dropped) > 0
    from transformers import AutoModelForImageTextToText

    AutoModelForImageTextToText.from_pretrained(tmp_path / "run" / "final")


# ---- 3. the final model from the sharded state ----------------------------------------------------------------
def _refuse(*args, **kwargs):
    raise AssertionError("save_final opened a second model")


def _rank_save_final(rank: int, world: int, cfg_json: dict, port: int, batches, out: str) -> None:
    """One training rank: a real update on its slice of the batch, then save_final twice (the second as a retry),
    with every way of opening a model made to fail."""
    import transformers

    import mazerl.policy.loading as loading
    import mazerl.rollout.factory as factory
    from mazerl.distributed.ray_grpo import TrainRank

    r = TrainRank(cfg_json, rank, world)
    r.setup(2, "127.0.0.1", port)
    r.train_steps([b.slice_for_rank(rank, world) for b in batches], 1)
    from mazerl.distributed.fsdp import full_state_dict
    from mazerl.policy.trainable import in_dtype

    expected = in_dtype(full_state_dict(r.model), r.cfg.policy.dtype)  # a collective: the trained weights
    factory.open_policy = loading.load_policy = _refuse
    for cls in (transformers.AutoModelForImageTextToText, transformers.PreTrainedModel):
        cls.from_pretrained = classmethod(_refuse)
        cls.from_config = classmethod(_refuse)
    target = Path(out) / "final"
    assert r.save_final(str(target)) == (str(target) if rank == 0 else None)
    if rank == 0:
        first = read_model_tensors(target)
        (target / "stale-file-from-an-earlier-attempt").write_text("x")
    assert r.save_final(str(target)) == (str(target) if rank == 0 else None)  # a retry writes it again
    if rank == 0:
        torch.save({"expected": serving_weights(expected, r.cfg.lora), "first": first}, Path(out) / "expected.pt")
    r.shutdown()


@pytest.mark.parametrize("variant", ["full-bf16", "lora"])
def test_save_final_writes_the_trained_sharded_weights_without_a_second_model(variant, small_mazes, tmp_path):
    import torch.multiprocessing as mp
    from test_distributed import _mini_batches
    from transformers import AutoModelForImageTextToText

    from mazerl.distributed.group import free_port

    policy = {"model": "tiny-base", "dtype": "bfloat16" if variant == "full-bf16" else "float32"}
    cfg = GRPOConfig.model_validate({"policy": policy, "train_data": "unused", "output_dir": "unused", "micro_batch": 3,
                                     "recompute_old_logprobs": True, "optim": {"lr": 1e-3}, "kl_coef": 0.0,
                                     **({"lora": {"r": 4, "alpha": 8}} if variant == "lora" else {})})
    batches = _mini_batches("tiny-base", small_mazes, n_batches=1)
    mp.spawn(_rank_save_final, args=(2, cfg.model_dump(mode="json"), free_port(), batches, str(tmp_path)), nprocs=2,
             join=True)
    final = tmp_path / "final"
    saved = torch.load(tmp_path / "expected.pt", weights_only=True)
    expected, written = saved["expected"], read_model_tensors(final)
    assert written.keys() == expected.keys()
    for name, value in expected.items():  # tensor by tensor: the trained weights, in policy.dtype
        assert written[name].dtype == getattr(torch, cfg.policy.dtype) and torch.equal(written[name], value), name
        assert torch.equal(saved["first"][name], value)
    base = read_model_tensors(PolicyConfig(model="tiny-base").model)
    moved = [n for n in expected if not torch.equal(expected[n].float(), base[n].float())]
    assert moved and (variant != "lora" or all("_proj" in n for n in moved))  # LoRA: merged into q/k/v/o
    # the retry replaced the directory whole: nothing of the earlier one, no temporary siblings left
    assert not (final / "stale-file-from-an-earlier-attempt").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".final")] == []
    # the same files as save_model_dir writes for these weights, and it opens the same ways
    plain = open_policy(PolicyConfig(model="tiny-base", dtype=cfg.policy.dtype), with_engine=False)
    plain.policy.model.load_state_dict(expected, strict=True)
    save_model_dir(plain.policy.model, plain.policy.processor, tmp_path / "reference", cfg.policy)
    assert sorted(p.name for p in final.iterdir()) == sorted(p.name for p in (tmp_path / "reference").iterdir())
    for name in ("config.json", "generation_config.json", "mazerl_policy.json", "tokenizer_config.json"):
        assert (final / name).read_bytes() == (tmp_path / "reference" / name).read_bytes(), name
    model = AutoModelForImageTextToText.from_pretrained(final)
    assert model.dtype == getattr(torch, cfg.policy.dtype)
    reopened = open_policy(PolicyConfig(model=str(final)), with_engine=False)
    assert reopened.config.view() == cfg.policy.view()


def test_a_large_model_is_written_in_shards_with_an_index_and_a_failed_write_keeps_the_previous_one(tmp_path):
    from safetensors import safe_open

    import mazerl.policy.export as export

    policy = PolicyConfig(model="tiny-base")
    tp = open_policy(policy, with_engine=False, for_training=True)
    target = tmp_path / "final"
    save_trained_model(tp.policy.model, tp.policy.processor, target, policy, max_shard_bytes=2 * 10**6)
    index = json.loads((target / INDEX_NAME).read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) >= 3 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert sorted(p.name for p in target.glob("*.safetensors")) == files
    state = tp.policy.model.state_dict()
    assert index["weight_map"].keys() == state.keys()
    assert index["metadata"]["total_size"] == sum(v.numel() * v.element_size() for v in state.values())
    for f in files:
        with safe_open(str(target / f), "pt") as fh:
            assert fh.metadata() == {"format": "pt"}
            assert all(index["weight_map"][k] == f for k in fh.keys())
    assert all(torch.equal(v, state[k]) for k, v in read_model_tensors(target).items())

    before = sorted(p.name for p in target.iterdir())

    def broken_processor_save(*args, **kwargs):
        raise OSError("disk full")

    class Broken:
        save_pretrained = staticmethod(broken_processor_save)

    with pytest.raises(OSError, match="disk full"):
        export.save_trained_model(tp.policy.model, Broken(), target, policy)
    assert sorted(p.name for p in target.iterdir()) == before  # the previous model, whole
    assert [p.name for p in tmp_path.iterdir()] == ["final"]  # no temporary directory left beside it
