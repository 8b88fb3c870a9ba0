"""The learning loop end to end on the tiny model: it learns, checkpoints, resumes bit-identically."""

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from safetensors.torch import load_file

from mazerl.config import ConfigError, load_config
from mazerl.mazes.dataset_io import read_split, records
from mazerl.mazes.layout import MOVES
from mazerl.mazes.solver import solve
from mazerl.rl.checkpoint import CheckpointManager, verify
from mazerl.rl.config import GRPOConfig, SFTConfig
from mazerl.metrics import read_metrics
from mazerl.rl.sft import train_sft
from mazerl.rl.trainer import KILL_AFTER_STEP_ENV, GRPOTrainer

POLICY = {"history": {"turns": 0, "images": 1}, "render_scale": 1.28, "max_new_tokens": 6, "prompt": "short"}


@pytest.fixture(scope="module")
def one_move_split(small_mazes, tmp_path_factory):
    """Mazes whose agent starts one square from the goal: the right first move wins at once."""
    rows = records(read_split(small_mazes / "train.parquet"))
    for rec in rows:
        moves = solve(np.array(rec["grid"], dtype=np.uint8), tuple(rec["start"]), tuple(rec["goal"]))
        r, c = rec["start"]
        for m in moves[:-1]:
            r, c = r + MOVES[m][0], c + MOVES[m][1]
        rec.update(start=[r, c], max_turns=1)
    path = tmp_path_factory.mktemp("one_move") / "one_move.parquet"
    # only what defines the maze and its budget: hashes, shortest path and strata are derived on read
    pq.write_table(pa.Table.from_pylist([{k: rec[k] for k in ("maze_id", "grid", "start", "goal", "max_turns")}
                                         for rec in rows]), path)
    assert set(read_split(path).shortest_path_moves) == {1}
    return path


@pytest.fixture(scope="module")
def warm_model(tiny_model_dir, small_mazes, tmp_path_factory):
    """The tiny model after a short behaviour-cloning warm start (answers in the right format)."""
    out = tmp_path_factory.mktemp("sft")
    cfg = SFTConfig.model_validate({
        "policy": {"model": str(tiny_model_dir), **POLICY}, "train_data": str(small_mazes / "train.parquet"),
        "output_dir": str(out), "steps": 25, "batch_size": 16,
        "optim": {"lr": 1e-3, "warmup_steps": 5, "schedule": "cosine"},
    })
    record = train_sft(cfg)
    assert record["token_accuracy"] > 0.6
    log = read_metrics(out / "metrics.jsonl")
    assert len(log) == 25 and log[-1]["loss"] < log[0]["loss"]
    return out / "final"


def grpo_config(model, data, out, **over) -> GRPOConfig:
    raw = {
        "policy": {"model": str(model), **POLICY}, "train_data": str(data), "output_dir": str(out),
        "steps": 12, "mazes_per_step": 4, "group_size": 8, "micro_batch": 32, "seed": 1,
        "optim": {"lr": 1e-3}, "env": {"terminate_on_goal": True}, "eval_every": 0, "checkpoint_every": 100,
    }
    raw.update(over)
    return GRPOConfig.model_validate(raw)


def test_reward_rises_on_an_easy_configuration(warm_model, one_move_split, tmp_path):
    """One-move mazes plus a format bonus: a short warm start samples mostly malformed replies at
    temperature 1, so there is plenty to learn in a few steps; a broken loss cannot raise it."""
    out = tmp_path / "grpo"
    # 12 steps of 32 episodes is a small sample: with seed 1 (under per-episode seeds) the sampled
    # rewards of the first steps happened to lie above those of the last; seeds 2 and 3 rise as expected
    cfg = grpo_config(warm_model, one_move_split, out, env={"terminate_on_goal": True, "format_bonus": 0.5}, seed=2)
    record = GRPOTrainer(cfg).run(resume="never")
    log = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in log] == list(range(1, 13))
    first = sum(r["reward_mean"] for r in log[:3]) / 3
    last = sum(r["reward_mean"] for r in log[-3:]) / 3
    assert last > first + 0.15, (first, last)
    assert record["kl"] == 0.0  # kl_coef 0: no reference model, no KL term
    assert 0.0 <= record["success_rate"] <= 1.0 and 0.0 <= record["parse_failure_rate"] <= 1.0
    assert 0.0 <= record["clip_fraction"] <= 1.0 and record["grad_norm"] > 0.0 and record["entropy"] > 0.0
    assert record["lr"] == cfg.optim.lr and record["rollout_tokens_per_s"] > 0
    assert record["time/rollout"] > 0 and record["time/update"] > 0
    assert 0 <= record["filtered_groups"] <= cfg.mazes_per_step
    assert any((out / "tensorboard").iterdir())
    assert verify(out / "checkpoints" / "step-00000012") is None


def run_cli(config_path, *args, env=None):
    return subprocess.run([sys.executable, "-m", "mazerl.cli", "train", "grpo", "--config", str(config_path), *args],
                          env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=600)


def test_killed_and_resumed_run_is_bit_identical(warm_model, one_move_split, tmp_path):
    def write(name):
        cfg = grpo_config(warm_model, one_move_split, tmp_path / name, steps=4, mazes_per_step=2, group_size=4,
                          checkpoint_every=2, keep_checkpoints=2)
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
        return path

    straight = run_cli(write("straight"))
    assert straight.returncode == 0, straight.stderr[-2000:]
    cfg = write("killed")
    killed = run_cli(cfg, env={KILL_AFTER_STEP_ENV: "3"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not (tmp_path / "killed" / "final").exists()
    assert (tmp_path / "killed" / "checkpoints" / "latest").read_text().strip() == "step-00000002"
    resumed = run_cli(cfg, "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a = load_file(tmp_path / "straight" / "final" / "model.safetensors")
    b = load_file(tmp_path / "killed" / "final" / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    changed = load_file(warm_model / "model.safetensors")
    assert any(not torch.equal(a[k], changed[k]) for k in a), "training changed nothing"
    steps = [r["step"] for r in read_metrics(tmp_path / "killed" / "metrics.jsonl")]
    assert steps == [1, 2, 3, 4]


def test_damaged_checkpoints_are_skipped(tiny_policy, tmp_path, caplog):
    policy, _ = tiny_policy
    mgr = CheckpointManager(tmp_path, keep_last=3)
    for step in (1, 2, 3):
        mgr.save(step, policy.model, policy.processor, {"optimizer": {}, "torch_rng": torch.get_rng_state()}, {"step": step})
    assert mgr.latest().name == "step-00000003"
    with open(tmp_path / "step-00000003" / "trainer_state.pt", "r+b") as fh:
        fh.write(b"garbage")
    (tmp_path / "step-00000002" / "manifest.json").unlink()
    assert mgr.latest().name == "step-00000001"
    assert "does not match its hash" in caplog.text and "no manifest" in caplog.text
    mgr.save(4, policy.model, policy.processor, {"torch_rng": torch.get_rng_state()}, {"step": 4})
    assert [p.name for _, p in mgr.step_dirs()] == ["step-00000002", "step-00000003", "step-00000004"]
    state = torch.load(tmp_path / "step-00000004" / "trainer_state.pt", weights_only=True)
    assert set(state) == {"torch_rng"}


def test_lora_trains_only_the_adapters(warm_model, one_move_split, tmp_path):
    cfg = grpo_config(warm_model, one_move_split, tmp_path / "lora", steps=2, lora={"r": 4, "alpha": 8}, kl_coef=0.01)
    trainer = GRPOTrainer(cfg)
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    trainer.run(resume="never")
    from transformers import AutoModelForImageTextToText

    merged = AutoModelForImageTextToText.from_pretrained(tmp_path / "lora" / "final")
    base = AutoModelForImageTextToText.from_pretrained(warm_model)
    diffs = [n for (n, p), (_, q) in zip(merged.named_parameters(), base.named_parameters()) if not torch.equal(p, q)]
    assert diffs and all("q_proj" in n or "k_proj" in n or "v_proj" in n or "o_proj" in n for n in diffs)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"mazes_per_step": 6, "mini_batch_mazes": 4}, "divisible"),
        ({"group_size": 1}, "group_size"),
        ({"learning_rate": 1e-5}, "learning_rate"),
        ({"optim": {"lr": "fast"}}, "optim.lr"),
        ({"loss_aggregation": "sum"}, "loss_aggregation"),
        ({"policy": {"model": "x", "history": {"images": 0}}}, "policy.history.images"),
    ],
)
def test_bad_configs_fail_at_load_naming_the_field(tmp_path, change, field):
    raw = {"policy": {"model": "m"}, "train_data": "t.parquet", "output_dir": "o", **change}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=field):
        load_config(GRPOConfig, path)


def test_the_retraining_config_is_the_demos_with_a_longer_run_and_a_bigger_batch():
    # Retraining's rounds are judged against the demo's recipe: a change to tiny-grpo (rewards, optimiser,
    # view) must reach tiny-grpo-retrain too (it extends tiny-grpo), or the two measure different things.
    demo = load_config(GRPOConfig, "tiny-grpo").model_dump()
    retrain = load_config(GRPOConfig, "tiny-grpo-retrain").model_dump()
    run_length = {"steps", "max_minutes", "mazes_per_step", "output_dir"}
    assert {k for k in demo if demo[k] != retrain[k]} == run_length
    assert retrain["mazes_per_step"] > demo["mazes_per_step"] and retrain["max_minutes"] > demo["max_minutes"]
    assert retrain["fit_schedule_to_max_minutes"]


def test_missing_model_is_a_clear_error(tmp_path, small_mazes):
    cfg = grpo_config(tmp_path / "no-model", small_mazes / "train.parquet", tmp_path / "o")
    from mazerl.policy.loading import PolicyLoadError

    with pytest.raises(PolicyLoadError, match="not found"):
        GRPOTrainer(cfg)
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(cfg.model_dump(mode="json")))
    result = run_cli(path)
    assert result.returncode == 2 and "model directory not found" in result.stderr


def test_grpo_under_the_action_grammar_raises_the_right_moves_probability(one_move_split, tmp_path):
    """From tiny-base, on one-move mazes: GRPO raises the policy's exact probability of the winning
    move (a deterministic measure, no sampling noise), and no reply ever fails to parse."""
    from mazerl.envs.agents import oracle_action
    from mazerl.envs.maze_env import MazeEnv
    from mazerl.policy.grammar import ActionGrammar
    from mazerl.policy.prompts import turn_text
    from mazerl.policy.chat import Conversation
    from mazerl.rollout.multiturn import items_from_split

    out = tmp_path / "grammar"
    cfg = grpo_config("tiny-base", one_move_split, out, policy={"model": "tiny-base"}, steps=6, mazes_per_step=16,
                      micro_batch=64, optim={"lr": 2e-4}, turn_advantage_weight=1.0)
    trainer = GRPOTrainer(cfg)
    grammar = ActionGrammar.from_chat(trainer.chat)
    items = items_from_split(trainer.train_df, range(len(trainer.train_df)), cfg.policy.render_scale)

    def p_right_move() -> float:
        contexts, images, wanted = [], [], []
        for item in items:
            env = MazeEnv(item.task)
            obs = env.reset()
            conv = Conversation()
            conv.add(trainer.chat.system())
            conv.add(trainer.chat.user_turn(1, turn_text("", 1, item.max_turns), obs.image.copy()))
            ctx = conv.context(1, 1)
            contexts.append(ctx.ids + list(grammar.prefix))
            images += ctx.images
            wanted.append(grammar.word_index(oracle_action(env)))
        with torch.no_grad():
            logits = trainer.model(**trainer.tp.engine._model_inputs(contexts, images)).logits[:, -1, list(grammar.word_ids)]
        probs = torch.softmax(logits.float(), dim=-1)
        return float(probs[torch.arange(len(wanted)), torch.tensor(wanted)].mean())

    before = p_right_move()
    trainer.run(resume="never")
    after = p_right_move()
    assert after > before + 0.02, (before, after)
    assert all(r["parse_failure_rate"] == 0.0 for r in read_metrics(out / "metrics.jsonl"))
    saved = json.loads((out / "final" / "mazerl_policy.json").read_text())
    assert saved["reply_grammar"] == "action"  # evaluation will decode the same way


def test_the_lr_schedule_advances_even_when_every_group_is_filtered(warm_model, one_move_split, tmp_path):
    from types import SimpleNamespace

    cfg = grpo_config(warm_model, one_move_split, tmp_path / "f", mazes_per_step=4, mini_batch_mazes=2,
                      optim={"lr": 1e-3, "warmup_steps": 10})
    trainer = GRPOTrainer(cfg)
    flat = [SimpleNamespace(reward=1.0, rewards=[1.0], group=g, samples=lambda: [], weights_version=0) for g in range(4) for _ in range(cfg.group_size)]
    before = trainer.scheduler.last_epoch
    stats = trainer.update(flat)
    assert stats["kept_episodes"] == 0 and stats["filtered_groups"] == 4 and stats["optimizer_steps"] == 0
    assert trainer.scheduler.last_epoch == before + 2  # one schedule step per mini-batch, as if it had trained


def test_rollouts_carry_the_weights_version_and_stale_ones_are_refused(warm_model, one_move_split, tmp_path):
    from types import SimpleNamespace

    from mazerl.rl.trainer import StaleRolloutError

    out = tmp_path / "v"
    cfg = grpo_config(warm_model, one_move_split, out, steps=2, mazes_per_step=2, recompute_old_logprobs=True)
    trainer = GRPOTrainer(cfg)
    trainer.run(resume="never")
    assert trainer.tp.engine.weights_version == 2  # synced after each of the 2 updates
    log = read_metrics(out / "metrics.jsonl")
    assert [r["weights_lag"] for r in log] == [0, 0] and all(r["time/weight_sync"] >= 0 for r in log)
    fresh = trainer.collect()
    assert {t.weights_version for t in fresh} == {2}
    old = [SimpleNamespace(weights_version=1)] * 3
    with pytest.raises(StaleRolloutError, match=r"version\(s\) \[1\].*max_weights_lag = 0"):
        trainer.check_versions(old)
    trainer.cfg = trainer.cfg.model_copy(update={"max_weights_lag": 1})
    assert trainer.check_versions(old) == 1  # asynchronous rollouts within the allowed lag
    with pytest.raises(StaleRolloutError):
        trainer.check_versions([SimpleNamespace(weights_version=3)])  # from the future: never


def test_the_in_process_engine_loads_synced_weights(tiny_model_dir):
    from mazerl.policy.config import PolicyConfig
    from mazerl.rollout.factory import open_policy

    a = open_policy(PolicyConfig(model=str(tiny_model_dir)))
    b = open_policy(PolicyConfig(model=str(tiny_model_dir)))
    with torch.no_grad():
        for p in a.policy.model.parameters():
            p.add_(0.01)
    b.engine.sync_weights({k: v.clone() for k, v in a.policy.model.state_dict().items()}, version=7)
    assert b.engine.weights_version == 7
    assert all(torch.equal(x, y) for x, y in zip(a.policy.model.state_dict().values(), b.policy.model.state_dict().values()))


def test_a_lora_run_killed_and_resumed_matches_an_uninterrupted_one(warm_model, one_move_split, tmp_path):
    """Adapters are checkpointed with peft's state-dict functions; a run SIGKILLed after step 2
    resumes from them (not from the base) and ends where an uninterrupted run does."""
    from peft import get_peft_model_state_dict

    from mazerl.rl.checkpoint import CheckpointMismatchError, load_model_weights

    lora = {"r": 4, "alpha": 8}
    straight = GRPOTrainer(grpo_config(warm_model, one_move_split, tmp_path / "a", steps=3, lora=lora, checkpoint_every=1))
    straight.run(resume="never")
    cfg = grpo_config(warm_model, one_move_split, tmp_path / "b", steps=3, lora=lora, checkpoint_every=1)
    path = tmp_path / "b.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    killed = run_cli(path, env={KILL_AFTER_STEP_ENV: "2"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not (tmp_path / "b" / "final").exists()
    assert (tmp_path / "b" / "checkpoints" / "latest").read_text().strip() == "step-00000002"
    assert (tmp_path / "b" / "checkpoints" / "step-00000002" / "model" / "adapter_model.safetensors").is_file()
    resumed = GRPOTrainer(cfg)
    resumed.run(resume="auto")
    assert [r["step"] for r in read_metrics(tmp_path / "b" / "metrics.jsonl")] == [1, 2, 3]
    a = get_peft_model_state_dict(straight.model)
    b = get_peft_model_state_dict(resumed.model)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    full = GRPOTrainer(grpo_config(warm_model, one_move_split, tmp_path / "c", steps=1, checkpoint_every=1))
    with pytest.raises(CheckpointMismatchError, match="does not fit"):
        load_model_weights(full.model, tmp_path / "b" / "checkpoints" / "step-00000003")
    # a full checkpoint loaded into a model of another shape is named as such, not torch's size dump
    from transformers import AutoModelForImageTextToText

    from mazerl.policy.tiny import init_tiny

    full.run(resume="never")
    other = AutoModelForImageTextToText.from_pretrained(init_tiny(tmp_path / "other", size="deep"))
    with pytest.raises(CheckpointMismatchError, match=r"is from another model \(shapes differ\): lm_head.weight"):
        load_model_weights(other, tmp_path / "c" / "checkpoints" / "step-00000001")


def test_skipping_zero_advantage_turns_keeps_the_gradient_and_trains_fewer_turns(small_mazes, tmp_path):
    """With per-state credit most turns (corridors every episode walked alike) have advantage 0:
    skipping them leaves the policy gradient's direction exactly as it was (token-mean: scaled by
    all loss tokens / the kept ones) and drops exactly the turns without signal."""
    cfg = grpo_config("tiny-base", small_mazes / "train.parquet", tmp_path / "z", policy={"model": "tiny-base"},
                      steps=1, mazes_per_step=4, micro_batch=256, temperature=1.0, episode_advantage_weight=0.0,
                      turn_advantage_weight=1.0, turn_baseline="state", turn_gamma=0.0, optim={"lr": 1e-30, "max_grad_norm": 1e9},
                      env={"progress_reward": 0.1, "wall_bump_penalty": 0.05})
    trainer = GRPOTrainer(cfg)
    trajs = trainer.collect()

    def gradient(skip: bool):
        trainer.cfg = cfg.model_copy(update={"skip_zero_advantage_turns": skip})
        [batch], stats = trainer.mini_batches(trajs)
        trainer.worker.train_step(batch, trainer.tp.sampling(temperature=1.0), 1)
        grad = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
        return batch, stats, grad

    full, full_stats, g_full = gradient(False)
    kept, kept_stats, g_kept = gradient(True)
    zero = [torch.all(a == 0).item() for a in full.token_advantages]
    assert 0 < sum(zero) < len(zero)  # the check means something: some turns carry signal, some do not
    assert kept_stats["trained_turns"] == len(zero) - sum(zero) == len(kept.samples)
    assert all(bool(torch.any(a != 0)) for a in kept.token_advantages)
    scaled = g_full * (full.tokens / kept.tokens)
    cosine = float(torch.nn.functional.cosine_similarity(g_kept, scaled, dim=0))
    assert cosine > 0.9999 and float(g_kept.norm() / scaled.norm()) == pytest.approx(1.0, rel=1e-3), cosine


def test_skipping_zero_advantage_turns_is_refused_with_a_kl_term(tmp_path):
    with pytest.raises(ValueError, match="kl_coef"):
        grpo_config("m", "t.parquet", tmp_path, kl_coef=0.01, skip_zero_advantage_turns=True)


def test_autocast_runs_rollouts_and_updates_in_bf16_over_float32_weights(small_mazes, tmp_path):
    """autocast bfloat16: the engine's and the update's matrix products run in bf16, the weights and
    their gradients stay float32, the sampled log-probabilities stay close to float32's (so the
    update's ratio starts near 1), and the periodic greedy evaluation is float32 as before."""
    from mazerl.rl.common import greedy_success

    cfg = grpo_config("tiny-base", small_mazes / "train.parquet", tmp_path / "bf16", policy={"model": "tiny-base"},
                      steps=1, mazes_per_step=2, micro_batch=64, autocast="bfloat16", optim={"lr": 1e-3},
                      episode_advantage_weight=0.0, turn_advantage_weight=1.0, turn_baseline="group", turn_gamma=0.0,
                      env={"progress_reward": 0.1, "wall_bump_penalty": 0.05})
    trainer = GRPOTrainer(cfg)
    seen: list[torch.dtype] = []
    trainer.model.lm_head.register_forward_hook(lambda module, args, out: seen.append(out.dtype))

    trajs = trainer.collect()
    assert seen and set(seen) == {torch.bfloat16}
    seen.clear()
    [batch], _ = trainer.mini_batches(trajs)
    sampled = torch.tensor([lp for s in batch.samples for lp, m in zip(s.old_logprobs, s.loss_mask) if m])
    trainer.worker.rescore_old_logprobs([batch], trainer.tp.sampling(temperature=cfg.temperature))
    assert set(seen) == {torch.bfloat16}  # the rescoring runs as the update will
    bf16_scores = torch.tensor([lp for s in batch.samples for lp, m in zip(s.old_logprobs, s.loss_mask) if m])
    from mazerl.rl.logprobs import token_logprobs

    with torch.no_grad():
        fp32_scores = token_logprobs(trainer.model, trainer.chat, batch.samples, trainer.tp.sampling(temperature=1.0),
                                     False, trainer.tp.reply_choices).logprobs
    assert torch.allclose(sampled, bf16_scores, atol=0.05)  # engine and trainer agree, both in bf16
    gap = (sampled - fp32_scores).abs()
    assert 0 < float(gap.median()) < 0.01 and float(gap.max()) < 0.2  # bf16 differs from float32, by little

    before = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    seen.clear()
    stats = trainer.update(trajs)
    assert set(seen) == {torch.bfloat16}
    assert stats["grad_norm"] > 0 and stats["clip_fraction"] < 0.05
    after = trainer.model.state_dict()
    assert all(v.dtype == torch.float32 for v in after.values() if v.is_floating_point())
    assert all(p.grad is None or p.grad.dtype == torch.float32 for p in trainer.model.parameters())
    assert any(not torch.equal(before[k], after[k]) for k in before)

    seen.clear()
    greedy_success(trainer.tp, cfg.policy, str(small_mazes / "train.parquet"), 2, cfg.env)
    assert set(seen) == {torch.float32}


def test_autocast_is_refused_over_weights_that_are_not_float32(tmp_path):
    with pytest.raises(ValueError, match="policy.dtype"):
        grpo_config("m", "t.parquet", tmp_path, autocast="bfloat16", policy={"model": "m", "dtype": "bfloat16"})


def test_a_cpu_without_bf16_instructions_is_recognised():
    from mazerl.rl.precision import cpu_bf16_support, cpu_lacks_bf16

    x86 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f {extra}\n"
    assert cpu_lacks_bf16(x86.format(extra="")) and cpu_lacks_bf16("processor\t: 0\nflags\t\t: fpu avx avx2\n")
    assert cpu_bf16_support(x86.format(extra="avx512_bf16")) is True
    assert cpu_bf16_support(x86.format(extra="amx_bf16 amx_tile")) is True
    assert cpu_bf16_support("processor\t: 0\nFeatures\t: fp asimd bf16\n") is True  # aarch64
    assert cpu_lacks_bf16("processor\t: 0\nFeatures\t: fp asimd\n")
    assert cpu_bf16_support("") is None and not cpu_lacks_bf16("")  # cannot tell: not judged lacking


def test_autocast_auto_is_bf16_only_where_the_cpu_multiplies_in_bf16():
    from mazerl.rl.precision import resolve_autocast

    with_bf16, without = "flags\t: avx2 avx512_bf16\n", "flags\t: avx2\n"
    assert resolve_autocast("auto", "cpu", with_bf16) == "bfloat16"
    assert resolve_autocast("auto", "cpu", without) == "off"  # emulated bf16 is ~20x slower than float32 here
    assert resolve_autocast("auto", "cpu", "") == "off"  # unknown: the safe choice
    assert resolve_autocast("bfloat16", "cpu", without) == "bfloat16"  # asked for explicitly: done (with a warning)
    assert resolve_autocast("off", "cpu", with_bf16) == "off"
    cfg = load_config(GRPOConfig, "tiny-grpo", {"train_data": "t.parquet", "output_dir": "o"})
    assert cfg.autocast == "auto"  # the shipped config never slows a CPU without bf16 down


class SteppingClock:
    """time.perf_counter for the trainer: every reading is `tick` seconds after the last."""

    def __init__(self, tick: float):
        self.now, self.tick = 0.0, tick

    def perf_counter(self) -> float:
        self.now += self.tick
        return self.now


@pytest.mark.parametrize("fit", [True, False])
def test_a_deadline_ends_the_learning_rate_schedule_and_the_curriculum_when_fitted(small_mazes, tmp_path, monkeypatch, fit):
    """With fit_schedule_to_max_minutes the rate reaches its floor on the step the deadline stops the run
    at, and a curriculum draws from the whole pool on that step; without it the run stops near the
    schedule's start, in the curriculum's easy part. The trainer's clock ticks 5 s a reading, so a
    step takes the same simulated time on any machine."""
    import mazerl.rl.trainer as trainer_module

    monkeypatch.setattr(trainer_module, "time", SteppingClock(5.0))
    cfg = grpo_config("tiny-base", small_mazes / "train.parquet", tmp_path / "g", policy={"model": "tiny-base"},
                      steps=100, mazes_per_step=2, group_size=2, micro_batch=64, max_turns=2, max_minutes=2.0,
                      fit_schedule_to_max_minutes=fit, curriculum_start=0.25, optim={"lr": 1e-3, "schedule": "cosine", "min_lr_ratio": 0.1})
    GRPOTrainer(cfg).run(resume="never")
    pool = len(read_split(small_mazes / "train.parquet"))
    rows = [r for r in read_metrics(tmp_path / "g" / "metrics.jsonl") if r.get("step")]
    assert 3 <= len(rows) < 100  # the deadline stopped it
    assert rows[-1]["time/training_total"] > 120 >= rows[-2]["time/training_total"]
    if fit:
        assert rows[-1]["lr"] == pytest.approx(1e-4)  # the floor, on the last step
        assert rows[-2]["lr_schedule_steps"] == len(rows)  # fitted after each step but the last
        assert all(a["lr"] > b["lr"] for a, b in zip(rows, rows[1:]))
        assert rows[-1]["train_pool_mazes"] == pool > rows[0]["train_pool_mazes"]
    else:
        assert rows[-1]["lr"] > 0.95e-3 and "lr_schedule_steps" not in rows[-1]
        assert rows[-1]["train_pool_mazes"] < pool / 2
