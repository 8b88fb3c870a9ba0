"""Weight sync with neither the driver nor a disk in the data path: the ranks gather the weights bucket
by bucket and push each straight into the engines (colocated: rank k to the rollout actor beside it;
split: rank 0's broadcast group), and the engines load buckets incrementally, each weight exactly once.

The vLLM parts run on its CPU build in its own venv (tests/weight_sync_checks.py records, these tests
assert); the Ray parts run RayGRPO in a process of its own with 2 FSDP2 ranks on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mazerl.distributed.weight_sync import (WeightSyncError, layout_of, module_groups, plan_buckets,
                                            weights_digest)

REPO = Path(__file__).resolve().parents[1]
CHECKS = REPO / "tests" / "weight_sync_checks.py"


def vllm_python() -> str:
    path = os.environ.get("MAZERL_VLLM_PYTHON") or str(REPO / ".venv-vllm" / "bin" / "python")
    if not Path(path).exists():
        pytest.fail(f"no vLLM venv at {path}: build it with `make vllm-env` (make test does)")
    return path


def _run(python: str, *args, cwd: Path, timeout: int = 1200) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIRTUAL_ENV")}
    env.update(RAY_AUTH_MODE="disabled", RAY_ADDRESS="", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([python, str(CHECKS), *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"weight_sync_checks.py {args[0]} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")


# ---- buckets and LoRA ------------------------------------------------------------------------------------
def _lora_model(tiny_model_dir):
    from conftest import lora_model

    return lora_model(tiny_model_dir)


@pytest.mark.parametrize("limit_bytes", [1, 64 * 1024, 2**30])
def test_buckets_keep_each_lora_layer_whole_so_merging_per_bucket_equals_merging_the_whole(tiny_model_dir, limit_bytes):
    from mazerl.policy.trainable import serving_weights

    model, lora = _lora_model(tiny_model_dir)
    state = model.state_dict()
    plan = plan_buckets({k: v.numel() * v.element_size() for k, v in state.items()}, limit_bytes)
    assert sorted(n for b in plan for n in b) == sorted(state)  # every name once
    if limit_bytes == 1:
        assert len(plan) == len(module_groups(state))  # one module per bucket
    for bucket in plan:
        for name in bucket:
            if ".lora_A." in name:
                module = name.split(".lora_A.")[0]
                assert {f"{module}.base_layer.weight", f"{module}.lora_B.default.weight"} <= set(bucket)
    merged = {}
    for bucket in plan:
        part = serving_weights({n: state[n] for n in bucket}, lora)
        assert not set(part) & set(merged)
        merged.update(part)
    whole = serving_weights(state, lora)
    assert set(merged) == set(whole)
    assert all(torch.equal(merged[k], whole[k]) for k in whole)
    assert any(not torch.equal(whole[k], state[f"base_model.model.{k[:-len('.weight')]}.base_layer.weight"])
               for k in whole if k.endswith("q_proj.weight"))  # the adapters did change the served weights


def test_a_group_larger_than_a_bucket_goes_alone():
    sizes = {"a.weight": 10, "a.bias": 1, "b.weight": 100, "c.weight": 5, "c.bias": 5}
    assert plan_buckets(sizes, 20) == [["a.weight", "a.bias"], ["b.weight"], ["c.weight", "c.bias"]]
    assert plan_buckets(sizes, 1000) == [list(sizes)]


# ---- the HF engine's incremental load --------------------------------------------------------------------
def test_hf_engine_loads_buckets_each_weight_once_and_refuses_what_is_not_its_layout(tiny_policy, tiny_model_dir):
    from mazerl.policy.loading import load_policy
    from mazerl.rollout.engine import GenerationRequest, HFEngine, SamplingParams

    _, chat = tiny_policy
    engine = HFEngine.from_chat(load_policy(tiny_model_dir).model, chat)
    g = torch.Generator().manual_seed(3)
    new = {k: v + torch.randn(v.shape, generator=g, dtype=v.dtype) if v.is_floating_point() else v.clone()
           for k, v in engine.model.state_dict().items()}
    plan = plan_buckets({k: v.numel() * v.element_size() for k, v in new.items()}, 256 * 1024)
    assert len(plan) > 2
    engine.begin_weight_sync(layout_of(new))
    for names in plan:
        engine.load_weight_bucket([(n, new[n]) for n in names])
    done = engine.finish_weight_sync(5)
    assert done == {"bytes": sum(v.numel() * v.element_size() for v in new.values()), "buckets": len(plan)}
    assert engine.weights_version == 5 and weights_digest(engine.model.state_dict().items()) == weights_digest(new.items())
    request = [GenerationRequest([t for s in chat.system() for t in s.ids], [], seed=0)]
    params = SamplingParams(temperature=0.0, max_new_tokens=2)
    before = engine.generate(request, params)[0].ids

    name = next(iter(new))
    wrong = {**layout_of(new), name: ((1, 2), torch.float32)}
    with pytest.raises(WeightSyncError, match=f"other shape or dtype \\({name}\\)"):
        engine.begin_weight_sync(wrong)
    assert engine.generate(request, params)[0].ids == before  # refused before anything was loaded
    engine.begin_weight_sync(layout_of(new))
    engine.load_weight_bucket([(name, new[name])])
    with pytest.raises(WeightSyncError, match="arrived twice"):
        engine.load_weight_bucket([(name, new[name])])
    with pytest.raises(WeightSyncError, match="incomplete"):
        engine.generate(request, params)  # half-synced: never served silently
    engine.begin_weight_sync(layout_of(new))
    engine.load_weight_bucket([(n, v) for n, v in new.items() if n != name])
    with pytest.raises(WeightSyncError, match=f"1 weights never arrived \\({name}\\)"):
        engine.finish_weight_sync(6)
    engine.begin_weight_sync()
    with pytest.raises(WeightSyncError, match="is not one this engine serves"):
        engine.load_weight_bucket([("model.no_such.weight", torch.zeros(1))])
    engine.sync_weights(new, 7)  # a complete sync: served again
    assert engine.generate(request, params)[0].ids == before and engine.weights_version == 7


# ---- the broadcast group, bucket by bucket ---------------------------------------------------------------
def _group_member(rank: int, port: int, out: str) -> None:
    from mazerl.distributed.weight_sync import WeightBroadcastGroup

    def weights(seed):
        g = torch.Generator().manual_seed(seed)
        return {"a.weight": torch.randn(3, 5, generator=g), "a.bias": torch.randn(3, generator=g).to(torch.bfloat16),
                "b.index": torch.arange(7), "c.weight": torch.randn(4, 4, generator=g).to(torch.float16),
                "d.empty": torch.zeros(0)}

    group = WeightBroadcastGroup("127.0.0.1", port, rank, 3, "gloo")
    layout = layout_of(weights(0))
    result = {}
    for seed in (1, 2):
        w = weights(seed)
        if rank == 0:
            group.send_begin(layout)
            for names in (["c.weight", "a.weight", "a.bias"], ["d.empty", "b.index"]):
                group.send_bucket([(n, w[n]) for n in names])
            group.send_end()
        else:
            group.receive_begin(layout)
            got = [[(n, t.clone()) for n, t in bucket] for bucket in group.receive_buckets()]
            result[seed] = {"buckets": [[n for n, _ in b] for b in got],
                            "equal": all(torch.equal(t, w[n]) and t.dtype == w[n].dtype for b in got for n, t in b)}
    other = {**layout, "a.weight": ((3, 6), torch.float32)} if rank == 0 else layout
    try:  # the sender's layout differs: all three refuse, the sender too (no one is left waiting)
        (group.send_begin if rank == 0 else group.receive_begin)(other)
        result["refused"] = False
    except WeightSyncError:
        result["refused"] = True
    torch.save(result, f"{out}/rank{rank}.pt")


def test_broadcast_group_sends_buckets_exactly_and_all_members_refuse_a_different_layout(tmp_path):
    import torch.multiprocessing as mp

    from mazerl.distributed.group import free_port

    port = free_port()
    procs = [mp.get_context("spawn").Process(target=_group_member, args=(r, port, str(tmp_path))) for r in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert torch.load(tmp_path / "rank0.pt") == {"refused": True}
    for r in (1, 2):
        result = torch.load(tmp_path / f"rank{r}.pt")
        assert result["refused"] is True
        for seed in (1, 2):
            assert result[seed] == {"buckets": [["c.weight", "a.weight", "a.bias"], ["d.empty", "b.index"]], "equal": True}


# ---- settings --------------------------------------------------------------------------------------------
def test_weight_sync_settings_refuse_the_driver_path_and_direct_without_colocation(small_mazes, tmp_path):
    import pydantic

    from mazerl.rl.config import GRPOConfig

    base = {"policy": {"model": "tiny-base"}, "train_data": str(small_mazes / "train.parquet"), "output_dir": str(tmp_path),
            "mazes_per_step": 2, "group_size": 2}
    with pytest.raises(pydantic.ValidationError, match="object_store.*no longer offered.*allowed: auto, direct"):
        GRPOConfig.model_validate({**base, "distributed": {"backend": "ray", "weight_sync": "object_store"}})
    with pytest.raises(pydantic.ValidationError, match="'direct'.*needs placement 'colocated'"):
        GRPOConfig.model_validate({**base, "distributed": {"backend": "ray", "weight_sync": "direct"}})
    for bad in (0, 16_385):
        with pytest.raises(pydantic.ValidationError, match="weight_sync_bucket_mb"):
            GRPOConfig.model_validate({**base, "distributed": {"weight_sync_bucket_mb": bad}})
    assert GRPOConfig.model_validate(base).distributed.weight_sync_bucket_mb == 512


# ---- vLLM (CPU build): bucketed syncs equal vLLM's own loading of the same weights ------------------------
@pytest.fixture(scope="module")
def vllm_syncs(tmp_path_factory) -> tuple[dict, Path]:
    work = tmp_path_factory.mktemp("vllm-sync")
    _run(vllm_python(), "vllm", work / "syncs.json", work, cwd=work)
    _run(vllm_python(), "reference", work / "reference.json", work, cwd=work)  # weights1, then weights2 from disk
    return json.loads((work / "syncs.json").read_text()), work


def test_vllm_engine_weights_equal_the_trainers_after_each_of_two_syncs(vllm_syncs):
    results, work = vllm_syncs
    initial = torch.load(work / "initial.pt")
    synced = [torch.load(work / f"synced{v}.pt") for v in (1, 2)]
    references = [torch.load(work / f"reference-weights{v}.pt") for v in (1, 2)]
    for got, want in zip(synced, references):
        assert set(got) == set(want) and len(got) > 50
        different = [k for k in want if not torch.equal(got[k], want[k])]
        assert not different, different[:5]
    # each sync brought other weights: every tensor moved, from the start and from the sync before
    assert all(not torch.equal(synced[0][k], initial[k]) and not torch.equal(synced[1][k], synced[0][k]) for k in initial)
    for version, sync in zip((1, 2), results["syncs"]):
        assert sync["version"] == version and sync["buckets"] == sync["planned_buckets"] > 5
        assert sync["bytes"] == sync["bytes_sent"] > 0
    assert results["syncs"][0]["generated"] != results["syncs"][1]["generated"]


def test_vllm_sync_writes_no_file_and_runs_the_engine_core_in_process(vllm_syncs):
    results, _ = vllm_syncs
    assert results["writes_during_syncs"] == []
    assert results["has_weights_dir"] is False
    assert results["engine_core"] == "InprocClient"


def test_vllm_engine_refuses_other_layouts_and_never_serves_a_half_synced_model(vllm_syncs):
    results, work = vllm_syncs
    assert "lm_head.weight" in results["wrong_layout"] and "nothing was loaded" in results["wrong_layout"]
    assert results["serves_after_wrong_layout"] is True
    assert "model.no_such.weight" in results["unknown_name"]
    assert "incomplete" in results["generate_when_half_synced"]
    assert "never arrived (lm_head.weight)" in results["missing_name"]
    # a complete sync afterwards serves again, the weights exactly vLLM's own load of them
    assert results["after_recovery"] == results["syncs"][1]["generated"]
    recovered, want = torch.load(work / "recovered.pt"), torch.load(work / "reference-weights2.pt")
    assert all(torch.equal(recovered[k], want[k]) for k in want)


# ---- Ray: 2 FSDP2 ranks on CPU, the driver only orchestrating -------------------------------------------
def _ray_config(small_mazes, out: Path, distributed: dict, **over) -> dict:
    return {"policy": {"model": "tiny-base"}, "train_data": str(small_mazes / "train.parquet"), "output_dir": str(out),
            "steps": 1, "mazes_per_step": 2, "group_size": 4, "max_turns": 4, "micro_batch": 8, "eval_every": 0,
            "checkpoint_every": 1, "env": {"progress_reward": 0.1},
            # groups whose episodes all scored the same are trained on too: an optimizer step (and so weight
            # decay) every step, so the update moves the weights whatever the rollouts drew
            "optim": {"lr": 1e-3, "weight_decay": 0.1}, "filter_zero_variance_groups": False,
            "distributed": {"backend": "ray", "ranks": 2, "cpus_per_actor": 0.5, "weight_sync_bucket_mb": 1, **distributed},
            **over}


@pytest.mark.parametrize("layout", ["colocated", "split-lora"])
def test_ray_engines_equal_the_trainer_after_a_step_and_the_driver_never_holds_weights(small_mazes, tmp_path, layout):
    """colocated: rank k feeds rollout actor k (direct); split with LoRA: rank 0 broadcasts merged weights.
    The trainer's side is read through the consolidated state dict, not the buckets the sync sent."""
    if layout == "colocated":
        cfg = _ray_config(small_mazes, tmp_path / "run", {"rollout_workers": 2, "placement": "colocated"})
    else:
        cfg = _ray_config(small_mazes, tmp_path / "run", {"rollout_workers": 1}, lora={"r": 4, "alpha": 8})
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    _run(sys.executable, "ray", tmp_path / "out.json", tmp_path, tmp_path / "cfg.json", cwd=tmp_path, timeout=900)
    r = json.loads((tmp_path / "out.json").read_text())
    assert r["mode"] == ("direct" if layout == "colocated" else "broadcast-gloo")
    engines = 2 if layout == "colocated" else 1
    assert r["engines0"] == [r["trainer0"]] * engines
    assert r["engines1"] == [r["trainer1"]] * engines and r["versions"] == [1] * engines
    assert r["trainer1"] != r["trainer0"], "the update did not move the weights: not a test of the second sync"
    for m in r["metrics"]:
        assert m["weight_sync/bytes"] > 1e6 and m["weight_sync/buckets"] > 5 and m["time/weight_sync"] > 0
    assert r["driver_puts"] == []  # the driver put nothing in the object store
    assert r["driver_received"] and set(r["driver_received"]) == {"numbers"}  # only numbers came back to it


def test_ray_colocated_vllm_engine_equals_the_trainer_after_a_step(tmp_path):
    """Colocated, one rank and a vLLM rollout actor beside it (direct): after the first sync and after a
    step's sync, the engine's weights read back inside vLLM equal vLLM's own load of the trainer's weights."""
    from mazerl.mazes.splits import DatasetConfig, generate_dataset
    from mazerl.policy.tiny import init_tiny

    model = init_tiny(tmp_path / "tiny", size="small", seed=1)  # head_dim 32: one vLLM's CPU attention supports
    generate_dataset(DatasetConfig.model_validate(
        {"reference_splits": {}, "splits": {"train": {"count": 4, "sizes": ["3x3"]}}}), tmp_path / "mazes")
    cfg = _ray_config(tmp_path / "mazes", tmp_path / "run", {"ranks": 1, "rollout_workers": 1, "cpus_per_actor": 1,
                                                              "placement": "colocated"},
                      policy={"model": str(model), "engine": "vllm", "prompt": "short", "max_new_tokens": 8},
                      max_turns=3)
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    _run(vllm_python(), "ray", tmp_path / "out.json", tmp_path, tmp_path / "cfg.json", cwd=tmp_path)
    _run(vllm_python(), "reference", tmp_path / "ref.json", tmp_path, "trained0", "trained1", cwd=tmp_path)
    r = json.loads((tmp_path / "out.json").read_text())
    assert r["mode"] == "direct" and r["versions"] == [1]
    assert r["trainer1"] != r["trainer0"], "the update did not move the weights: not a test of the second sync"
    for k in (0, 1):
        got, want = torch.load(tmp_path / f"engine-trained{k}.pt"), torch.load(tmp_path / f"reference-trained{k}.pt")
        assert set(got) == set(want) and len(got) > 50
        assert not [n for n in want if not torch.equal(got[n], want[n])]
    assert r["driver_puts"] == [] and set(r["driver_received"]) == {"numbers"}
    assert all(m["weight_sync/bytes"] > 1e6 and m["weight_sync/buckets"] > 5 for m in r["metrics"])
