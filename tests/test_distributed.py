"""Data-parallel ranks with FSDP2 over gloo, for real on CPU: two ranks sharding the policy make the
same update as one process on the same global mini-batch."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from mazerl.distributed.group import run_group
from mazerl.envs.agents import as_reply, oracle_action
from mazerl.mazes.dataset_io import read_split
from mazerl.policy.config import PolicyConfig
from mazerl.rollout.factory import open_policy
from mazerl.rl.config import GRPOConfig
from mazerl.rl.worker import MiniBatch, PolicyWorker
from mazerl.rollout.multiturn import items_from_split, rollout


def _config(model: str) -> GRPOConfig:
    # recompute_old_logprobs: the teacher's replies carry no sampler log-probabilities
    return GRPOConfig.model_validate({"policy": {"model": model}, "train_data": "unused", "output_dir": "unused",
                                      "micro_batch": 3, "recompute_old_logprobs": True, "optim": {"lr": 1e-3}})


def _mini_batches(model: str, mazes, n_batches: int = 2) -> list[MiniBatch]:
    """Teacher-forced turns of oracle episodes with fixed random advantages: a deterministic batch."""
    tp = open_policy(PolicyConfig(model=model))
    df = read_split(mazes / "heldout.parquet")
    gen = torch.Generator().manual_seed(0)
    batches = []
    for b in range(n_batches):
        items = items_from_split(df, range(3 * b, 3 * b + 3), tp.config.render_scale, max_turns=3)
        trajs = rollout(None, tp.chat, items, teacher=lambda env: (as_reply(oracle_action(env)), True),
                        history=tp.config.history, sampling=tp.sampling())
        pairs = [(s, i) for i, t in enumerate(trajs) for s in t.samples() if s.n_loss_tokens]
        adv = [torch.randn(s.n_loss_tokens, generator=gen) for s, _ in pairs]
        lengths = torch.zeros(len(trajs), dtype=torch.long)
        for s, i in pairs:
            lengths[i] += s.n_loss_tokens
        batches.append(MiniBatch(samples=[s for s, _ in pairs], episode=[i for _, i in pairs], token_advantages=adv,
                                 tokens=sum(s.n_loss_tokens for s, _ in pairs), episodes=len(trajs), episode_tokens=lengths))
    return batches


def _rank_worker(rank: int, world: int, model: str, optimizer_steps: int):
    """This rank's policy (sharded when there are several ranks), its worker and sampling settings."""
    from mazerl.distributed.fsdp import shard_policy

    cfg = _config(model)
    tp = open_policy(cfg.policy)
    if world > 1:
        shard_policy(tp.policy.model)
    worker = PolicyWorker(tp.policy.model, tp.chat, tp.reply_choices, cfg, total_optimizer_steps=optimizer_steps,
                          rank=rank, world_size=world)
    return tp.policy.model, worker, tp.sampling(temperature=1.0)


def _step(worker: PolicyWorker, batch: MiniBatch, sampling, step: int) -> dict:
    """One GRPO step of one mini-batch; the teacher's replies carry no sampler log-probabilities, so
    the trainer scores them first (recompute_old_logprobs)."""
    worker.rescore_old_logprobs([batch], sampling)
    return worker.train_step(batch, sampling, step)


def test_old_logprobs_are_rescored_for_every_mini_batch_before_the_first_update(small_mazes):
    """With several mini-batches per step, the second one is still compared with the weights that
    sampled it, not with weights the first mini-batch already changed."""
    from mazerl.rl.logprobs import token_logprobs

    batches = _mini_batches("tiny-base", small_mazes)
    model_, worker, sampling = _rank_worker(0, 1, "tiny-base", len(batches))
    with torch.no_grad():
        before = token_logprobs(model_, worker.chat, batches[1].samples, sampling, False, worker.choices).logprobs
    worker.rescore_old_logprobs(batches, sampling)
    worker.train_step(batches[0], sampling, 1)
    kept = torch.tensor([lp for smp in batches[1].samples for lp, m in zip(smp.old_logprobs, smp.loss_mask) if m])
    assert torch.allclose(kept, before, atol=1e-6)
    with torch.no_grad():
        after = token_logprobs(model_, worker.chat, batches[1].samples, sampling, False, worker.choices).logprobs
    assert (after - before).abs().max() > 1e-4  # the first mini-batch's update did move them


def _train(rank: int, world: int, model: str, batches: list[MiniBatch], out_file: str | None) -> dict:
    from mazerl.distributed.fsdp import full_state_dict

    model_, worker, sampling = _rank_worker(rank, world, model, len(batches))
    steps = [_step(worker, b, sampling, i + 1) for i, b in enumerate(batches)]
    losses = torch.tensor([s["loss"] for s in steps], dtype=torch.float64)
    if world > 1:
        dist.all_reduce(losses)  # each rank's share of the mini-batch loss
    state = full_state_dict(model_) if world > 1 else model_.state_dict()
    # the gradient norm (before clipping) is the whole mini-batch's on every rank: Adam's step hides a
    # wrongly scaled gradient, the norm does not
    result = {"losses": losses.tolist(), "grad_norms": [s["grad_norm"] for s in steps], "state": {k: v.detach().clone() for k, v in state.items()}}
    if out_file is not None and rank == 0:
        torch.save(result, out_file)
    return result


def test_two_fsdp_ranks_make_the_same_update_as_one_process(small_mazes, tmp_path):
    model = "tiny-base"
    batches = _mini_batches(model, small_mazes)
    assert len(batches[0].samples) % 2 == 1  # an odd count: one rank gets an extra sample
    single = _train(0, 1, model, batches, None)
    out = tmp_path / "ranks.pt"
    run_group(2, _train, model, batches, str(out))
    sharded = torch.load(out, weights_only=True)
    assert sharded["losses"] == pytest.approx(single["losses"], abs=1e-5)
    assert sharded["grad_norms"] == pytest.approx(single["grad_norms"], rel=1e-5)
    assert single["state"].keys() == sharded["state"].keys()
    moved = 0
    off, total = 0, 0
    initial = open_policy(PolicyConfig(model=model)).policy.model.state_dict()
    for k, v in single["state"].items():
        gap = (v - sharded["state"][k]).abs()
        # never more than one Adam step (lr 1e-3 x 2 steps) apart, and almost every weight equal to 1e-5:
        # Adam moves a weight whose gradient is ~0 by up to lr whatever its sign, so where summation
        # order alone decides that sign (tiny-base's sharp fitted attention heads) a few weights differ
        assert gap.max() <= 2e-3 + 1e-6, (k, gap.max())
        off += int((gap > 1e-5).sum())
        total += gap.numel()
        moved += int(not torch.equal(v, initial[k]))
    assert off <= 1e-3 * total, f"{off} of {total} weights differ by more than 1e-5"
    assert moved > 10  # the update really changed the weights


def _train_with_checkpoint(rank: int, world: int, model: str, batches: list[MiniBatch], ckpt: str, mode: str, out_file: str):
    """mode 'save': step 1, checkpoint, step 2; mode 'resume': load the checkpoint, step 2."""
    from mazerl.distributed.checkpoint import load_sharded, save_sharded
    from mazerl.distributed.fsdp import full_state_dict

    model_, worker, sampling = _rank_worker(rank, world, model, len(batches))
    if mode == "save":
        _step(worker, batches[0], sampling, 1)
        save_sharded(ckpt, model_, worker.optimizer, worker.scheduler, {"step": 1}, rank, world)
    else:
        assert load_sharded(ckpt, model_, worker.optimizer, worker.scheduler, rank, world)["step"] == 1
    _step(worker, batches[1], sampling, 2)
    state = full_state_dict(model_) if world > 1 else model_.state_dict()
    if rank == 0:
        torch.save({k: v.detach().clone() for k, v in state.items()}, out_file)


def test_sharded_checkpoints_resume_exactly_and_on_another_world_size(small_mazes, tmp_path):
    from mazerl.rl.checkpoint import verify

    model = "tiny-base"
    batches = _mini_batches(model, small_mazes)
    ckpt = tmp_path / "step-00000001"
    run_group(2, _train_with_checkpoint, model, batches, str(ckpt), "save", str(tmp_path / "straight.pt"))
    assert verify(ckpt) is None and not (tmp_path / ".step-00000001.tmp").exists()
    run_group(2, _train_with_checkpoint, model, batches, str(ckpt), "resume", str(tmp_path / "resumed2.pt"))
    _train_with_checkpoint(0, 1, model, batches, str(ckpt), "resume", str(tmp_path / "resumed1.pt"))
    straight, two, one = (torch.load(tmp_path / f, weights_only=True) for f in ("straight.pt", "resumed2.pt", "resumed1.pt"))
    assert all(torch.equal(straight[k], two[k]) for k in straight)  # same ranks: bit-identical
    assert all(torch.allclose(straight[k], one[k], atol=1e-5) for k in straight)  # 2 ranks -> 1 rank
    # a damaged shard is refused before anything is loaded
    shard = next((ckpt / "dcp").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    from mazerl.rl.checkpoint import CheckpointMismatchError

    with pytest.raises(CheckpointMismatchError, match="cannot be trusted"):
        _train_with_checkpoint(0, 1, model, batches, str(ckpt), "resume", str(tmp_path / "x.pt"))


def _broadcast_member(rank: int, port: int, out: str) -> None:
    import torch

    from mazerl.distributed.weight_sync import WeightBroadcastGroup, WeightSyncError

    torch.manual_seed(0)
    weights = {"a.weight": torch.randn(3, 4), "b.bias": torch.randn(5).to(torch.bfloat16), "c": torch.arange(6).reshape(2, 3)}
    group = WeightBroadcastGroup("127.0.0.1", port, rank, 3, "gloo")
    if rank == 0:
        group.send(weights)
        group.send({**weights, "a.weight": torch.randn(3, 5)})  # a different layout: receivers must refuse it
        return
    spec = {k: (tuple(v.shape), v.dtype) for k, v in weights.items()}
    got = group.receive(spec)
    ok = all(torch.equal(got[k], weights[k]) and got[k].dtype == weights[k].dtype for k in weights)
    try:
        group.receive(spec)
        refused = False
    except WeightSyncError:
        refused = True
    torch.save({"equal": ok, "refused": refused}, f"{out}/rank{rank}.pt")


def test_weight_broadcast_group_sends_exact_tensors_and_refuses_a_different_layout(tmp_path):
    """The broadcast path (a process group of its own on a TCPStore, gloo here, NCCL on GPU): every
    receiver gets bit-identical tensors; a sender with other names/shapes is refused, not loaded."""
    import torch
    import torch.multiprocessing as mp

    from mazerl.distributed.group import free_port

    port = free_port()
    procs = [mp.get_context("spawn").Process(target=_broadcast_member, args=(r, port, str(tmp_path))) for r in range(3)]
    for p in procs:
        p.start()
    for p in procs[1:]:
        p.join(timeout=120)
    # rank 0 is left sending the refused layout's tensors to receivers that stopped after the digest
    procs[0].join(timeout=10)
    assert [p.exitcode for p in procs[1:]] == [0, 0]
    for r in (1, 2):
        result = torch.load(tmp_path / f"rank{r}.pt")
        assert result == {"equal": True, "refused": True}
    for p in procs:
        if p.is_alive():
            p.kill()


class _PartlyUsed(torch.nn.Module):
    """A model with a parameter no loss ever reaches (as Qwen3-VL's deepstack mergers past a shallow
    decoder's depth): AdamW keeps no state for it, so its checkpoint has none."""

    def __init__(self):
        super().__init__()
        self.used = torch.nn.Linear(4, 4)
        self.unused = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.used(x)


def _partly_used_step(model, optimizer, scheduler, seed: int) -> None:
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(seed))
    optimizer.zero_grad(set_to_none=True)
    model(x).pow(2).mean().backward()
    optimizer.step()
    scheduler.step()


def test_sharded_checkpoint_of_a_parameter_without_optimizer_state_resumes_exactly(tmp_path):
    from mazerl.distributed.checkpoint import load_sharded, save_sharded

    def fresh():
        torch.manual_seed(0)
        model = _PartlyUsed()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        return model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))

    model, optimizer, scheduler = fresh()
    _partly_used_step(model, optimizer, scheduler, 1)
    assert len(optimizer.state) == 2  # the used layer's weight and bias only
    save_sharded(tmp_path / "step-1", model, optimizer, scheduler, {"step": 1})
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    _partly_used_step(model, optimizer, scheduler, 2)
    straight = {k: v.clone() for k, v in model.state_dict().items()}
    assert not torch.equal(straight["used.weight"], saved["used.weight"])

    # into the same optimizer, which already has state, and into a fresh one, which has none yet
    for target in ((model, optimizer, scheduler), fresh()):
        assert load_sharded(tmp_path / "step-1", *target)["step"] == 1
        assert all(torch.equal(target[0].state_dict()[k], v) for k, v in saved.items())
        _partly_used_step(*target, 2)
        assert all(torch.equal(target[0].state_dict()[k], v) for k, v in straight.items())
        assert torch.equal(target[0].unused.weight, saved["unused.weight"])  # never trained, never moved
