"""The shipped cluster configs' training precision and memory settings, run for real on the tiny model
on CPU: float32 master weights (and AdamW state) under bf16 compute, in one process and on two FSDP2
ranks over gloo, so that an lr-1e-6 update moves a weight of magnitude 0.05 (in bf16 it rounds away);
and activation checkpointing, which recomputes every decoder layer in the backward pass and gives the
same loss and gradients as keeping the activations.

Only what cannot run here is replaced: the model (tiny-base for Qwen3-VL-8B/2B), the device (CPU),
the data paths, and for the ranks the Ray sizing (2 CPU ranks instead of 8 GPUs). The dtype, the
learning rate, the KL anchor, the micro-batch and activation checkpointing are the shipped files'.
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from mazerl.config import load_config
from mazerl.envs.agents import as_reply, oracle_action
from mazerl.mazes.dataset_io import read_split
from mazerl.rl.config import GRPOConfig
from mazerl.rl.worker import MiniBatch
from mazerl.rollout.multiturn import items_from_split, rollout

SHIPPED_8B = "qwen3vl-8b-grpo"
SHIPPED_2B_LORA = "qwen3vl-2b-grpo-lora"


def _shipped(name: str, mazes, out, **overrides) -> GRPOConfig:
    """A shipped job config with the model, device and data paths replaced (nothing else)."""
    return load_config(GRPOConfig, name, {"policy.model": "tiny-base", "policy.device": "cpu",
                                          "train_data": str(mazes / "train.parquet"), "eval_data": None,
                                          "output_dir": str(out), **overrides})


def _mini_batch(tp, mazes) -> MiniBatch:
    """Teacher-forced oracle turns of two heldout mazes with fixed random advantages (deterministic)."""
    df = read_split(mazes / "heldout.parquet")
    items = items_from_split(df, range(2), tp.config.render_scale, max_turns=3)
    trajs = rollout(None, tp.chat, items, teacher=lambda env: (as_reply(oracle_action(env)), True),
                    history=tp.config.history, sampling=tp.sampling())
    pairs = [(s, i) for i, t in enumerate(trajs) for s in t.samples() if s.n_loss_tokens]
    gen = torch.Generator().manual_seed(0)
    lengths = torch.zeros(len(trajs), dtype=torch.long)
    for s, i in pairs:
        lengths[i] += s.n_loss_tokens
    return MiniBatch(samples=[s for s, _ in pairs], episode=[i for _, i in pairs],
                     token_advantages=[torch.randn(s.n_loss_tokens, generator=gen) for s, _ in pairs],
                     tokens=sum(s.n_loss_tokens for s, _ in pairs), episodes=len(trajs), episode_tokens=lengths)


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP2 parameter or gradient (a DTensor); a plain tensor as it is."""
    return t.to_local() if hasattr(t, "to_local") else t


def _first_decoder_layer(model):
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model.language_model.layers[0]


def _train_one_step(model, worker, sampling, batch) -> dict:
    """One GRPO update as the trainer runs it (the teacher's turns carry no sampler log-probabilities, so
    the trainer scores them first), watching the first decoder layer: how often it ran, in what dtype."""
    # before any forward pass: FSDP2 leaves the root's parameters unsharded after a forward
    before = {n: _local(p).detach().clone() for n, p in model.named_parameters()}
    worker.rescore_old_logprobs([batch], sampling)
    # a pre-hook: a recomputation stops once it has what the backward pass needs, before any forward hook
    layer, calls, dtypes = _first_decoder_layer(model), [], set()
    hooks = [layer.register_forward_pre_hook(lambda module, args: calls.append(1)),
             layer.mlp.register_forward_hook(lambda module, args, out: dtypes.add(out.dtype))]
    try:
        out = worker.train_step(batch, sampling, 1)
    finally:
        for hook in hooks:
            hook.remove()
    # the trained weights of magnitude 0.03-0.1 with a gradient clearly above AdamW's eps (there an update
    # is ~lr): how many, and how many the step changed at all
    candidates = moved = 0
    for name, p in model.named_parameters():
        if p.requires_grad and p.grad is not None:
            w0, g = before[name], _local(p.grad)
            pick = (w0.abs() > 0.03) & (w0.abs() < 0.1) & (g.abs() > 1e-6)
            candidates += int(pick.sum())
            moved += int((_local(p).detach() != w0)[pick].sum())
    exp_avg_dtypes = {_local(s["exp_avg"]).dtype for s in worker.optimizer.state.values()}
    return {"loss": out["loss"], "grad_norm": out["grad_norm"], "candidates": candidates, "moved": moved,
            "layer_calls": len(calls), "compute_dtypes": dtypes, "exp_avg_dtypes": exp_avg_dtypes,
            "micro_batches": len(worker._micro_batch_rows(batch)),
            "trained_dtypes": {_local(p).dtype for p in model.parameters() if p.requires_grad},
            "grads": {n: _local(p.grad).detach().clone() for n, p in model.named_parameters() if p.grad is not None}}


def _in_process_step(cfg: GRPOConfig, mazes) -> tuple[dict, object]:
    from mazerl.rl.trainer import GRPOTrainer

    trainer = GRPOTrainer(cfg)
    batch = _mini_batch(trainer.tp, mazes)
    return _train_one_step(trainer.model, trainer.worker, trainer.tp.sampling(temperature=cfg.temperature), batch), trainer


@pytest.fixture(scope="module")
def shipped_8b_step(small_mazes, tmp_path_factory):
    cfg = _shipped(SHIPPED_8B, small_mazes, tmp_path_factory.mktemp("run8b"))
    result, trainer = _in_process_step(cfg, small_mazes)
    result["reference_dtypes"] = {p.dtype for p in trainer.worker.reference.parameters()}
    return cfg, result


def test_shipped_8b_config_moves_weights_at_lr_1e_6_with_float32_masters_and_bf16_compute(shipped_8b_step):
    cfg, step = shipped_8b_step
    assert (cfg.policy.dtype, cfg.optim.lr, cfg.lora) == ("bfloat16", 1e-6, None)  # what ships
    # weights of magnitude ~0.05: a 1e-6 step is below half a bf16 ulp (1.2e-4) there, and rounded away
    assert step["candidates"] > 100
    assert step["moved"] >= 0.99 * step["candidates"], f"{step['moved']} of {step['candidates']} weights moved"
    assert step["trained_dtypes"] == {torch.float32} and step["exp_avg_dtypes"] == {torch.float32}
    assert step["compute_dtypes"] == {torch.bfloat16}  # the arithmetic is still bf16
    assert step["reference_dtypes"] == {torch.bfloat16}  # the never-trained KL anchor stays in bf16


def test_shipped_configs_checkpoint_activations_and_get_the_same_loss_and_gradients(shipped_8b_step, small_mazes, tmp_path):
    cfg, with_ckpt = shipped_8b_step
    assert cfg.distributed.activation_checkpointing
    assert load_config(GRPOConfig, SHIPPED_2B_LORA).distributed.activation_checkpointing
    without_cfg = _shipped(SHIPPED_8B, small_mazes, tmp_path / "run", **{"distributed.activation_checkpointing": False})
    without, _ = _in_process_step(without_cfg, small_mazes)
    # each micro-batch's forward, then (checkpointed) its recomputation in the backward pass
    assert without["layer_calls"] == without["micro_batches"]
    assert with_ckpt["layer_calls"] == 2 * with_ckpt["micro_batches"]
    assert with_ckpt["loss"] == pytest.approx(without["loss"], rel=1e-6, abs=1e-7)
    assert with_ckpt["grads"].keys() == without["grads"].keys()
    for name, grad in without["grads"].items():
        assert torch.allclose(with_ckpt["grads"][name], grad, rtol=1e-5, atol=1e-7), name


def test_shipped_lora_config_trains_float32_adapters_over_a_bf16_base_with_checkpointing(small_mazes, tmp_path):
    from mazerl.rollout.factory import open_policy

    cfg = _shipped(SHIPPED_2B_LORA, small_mazes, tmp_path / "run")
    tp = open_policy(cfg.policy, cfg.lora, with_engine=False, for_training=True,
                     activation_checkpointing=cfg.distributed.activation_checkpointing)
    params = list(tp.policy.model.named_parameters())
    assert {p.dtype for _, p in params if p.requires_grad} == {torch.float32}
    assert {p.dtype for _, p in params if not p.requires_grad} == {torch.bfloat16}  # the frozen base: as served
    assert _first_decoder_layer(tp.policy.model).gradient_checkpointing


def _rank_main(rank: int, world: int, cfg_json: dict, port: int, batch: MiniBatch, out: str) -> None:
    """One training rank exactly as the Ray backend sets it up (TrainRank.setup: process group, policy
    opened for training, FSDP2), then one update and the weights it would serve."""
    from mazerl.distributed.ray_grpo import TrainRank

    train_rank = TrainRank(cfg_json, rank, world)
    train_rank.setup(1, "127.0.0.1", port)
    try:
        sampling = train_rank.tp.sampling(temperature=train_rank.cfg.temperature)
        result = _train_one_step(train_rank.model, train_rank.worker, sampling, batch)
        del result["grads"]
        served = train_rank.full_state_dict()  # a collective; rank 0 gets the weights
        result["served_dtypes"] = None if served is None else {v.dtype for v in served.values() if v.is_floating_point()}
        torch.save(result, f"{out}/rank{rank}.pt")
    finally:
        train_rank.shutdown()


def test_shipped_8b_config_on_two_fsdp_ranks_keeps_float32_masters_and_checkpoints_activations(small_mazes, tmp_path):
    from mazerl.distributed.group import free_port
    from mazerl.rollout.factory import open_policy

    cfg = _shipped(SHIPPED_8B, small_mazes, tmp_path / "run", **{"distributed.backend": "ray", "distributed.ranks": 2,
                                                                 "distributed.rollout_workers": 2})
    batch = _mini_batch(open_policy(cfg.policy, with_engine=False), small_mazes)
    mp.spawn(_rank_main, args=(2, cfg.model_dump(mode="json"), free_port(), batch, str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    candidates, moved = sum(r["candidates"] for r in ranks), sum(r["moved"] for r in ranks)
    assert candidates > 100 and moved >= 0.99 * candidates, f"{moved} of {candidates} weights moved"
    for r in ranks:
        assert r["trained_dtypes"] == {torch.float32} and r["exp_avg_dtypes"] == {torch.float32}  # the shards
        assert r["compute_dtypes"] == {torch.bfloat16}  # FSDP2 gathers them in bf16
        assert r["layer_calls"] == 2 * r["micro_batches"]  # checkpointed: recomputed in the backward pass
    # rollout engines hold policy.dtype: rank 0 serves bf16 (the broadcast refuses any other layout)
    assert ranks[0]["served_dtypes"] == {torch.bfloat16} and ranks[1]["served_dtypes"] is None
