import pytest
import torch

from mazerl.rl.grpo import group_advantages, grpo_loss, k3_kl


def test_group_advantages():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.5, 0.5])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2])
    adv, zero = group_advantages(r, g)
    assert adv[:4].tolist() == pytest.approx([3 ** 0.5, -(3 ** -0.5), -(3 ** -0.5), -(3 ** -0.5)], rel=1e-5)
    assert adv[4:].abs().max() == 0 and zero[4:].all() and not zero[:4].any()
    raw, _ = group_advantages(r, g, scale_by_std=False)
    assert raw[:4].tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_on_policy_loss_is_minus_mean_advantage_and_gradient_points_uphill():
    logp = torch.log(torch.tensor([0.5, 0.2, 0.9])).requires_grad_()
    adv = torch.tensor([1.0, -2.0, 0.5])
    loss, stats = grpo_loss(logp, logp.detach(), adv, torch.tensor([0, 0, 1]))
    assert loss.item() == pytest.approx(-(1.0 - 2.0 + 0.5) / 3)
    loss.backward()
    assert logp.grad.tolist() == pytest.approx([-1 / 3, 2 / 3, -0.5 / 3])  # descent raises logp where adv > 0
    assert stats.clip_fraction == 0 and stats.ratio_mean == pytest.approx(1.0)


def test_clipping_stops_the_gradient_outside_the_trust_region():
    old = torch.log(torch.tensor([0.5, 0.5]))
    logp = torch.log(torch.tensor([0.8, 0.2])).requires_grad_()  # ratios 1.6 and 0.4
    adv = torch.tensor([1.0, -1.0])
    loss, stats = grpo_loss(logp, old, adv, torch.tensor([0, 1]), clip_low=0.2, clip_high=0.28)
    loss.backward()
    assert logp.grad.abs().max() == 0
    assert stats.clip_fraction == 1.0
    assert loss.item() == pytest.approx(-(1.28 * 1 + 0.8 * -1) / 2)


def test_seq_mean_weights_sequences_equally():
    logp = torch.zeros(4)
    adv = torch.tensor([1.0, 1.0, 1.0, -1.0])  # sequence 0 has 3 tokens, sequence 1 has 1
    seq = torch.tensor([0, 0, 0, 1])
    token, _ = grpo_loss(logp, logp, adv, seq, aggregation="token-mean")
    per_seq, _ = grpo_loss(logp, logp, adv, seq, aggregation="seq-mean")
    assert token.item() == pytest.approx(-0.5)
    assert per_seq.item() == pytest.approx(0.0)
    with pytest.raises(ValueError, match="aggregation"):
        grpo_loss(logp, logp, adv, seq, aggregation="sum")


def test_micro_batches_with_normalisers_equal_the_full_batch():
    torch.manual_seed(0)
    logp = torch.randn(10).requires_grad_()
    old = logp.detach() + 0.1 * torch.randn(10)
    adv = torch.randn(10)
    seq = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 3])
    lengths = torch.bincount(seq)
    for agg in ("token-mean", "seq-mean"):
        full, _ = grpo_loss(logp, old, adv, seq, aggregation=agg)
        parts = [
            grpo_loss(logp[a:b], old[a:b], adv[a:b], seq[a:b], aggregation=agg, token_normaliser=10.0,
                      seq_normaliser=4.0, seq_lengths=lengths)[0]
            for a, b in ((0, 4), (4, 10))
        ]
        assert (parts[0] + parts[1]).item() == pytest.approx(full.item(), rel=1e-6)


def test_k3_kl():
    a = torch.log(torch.tensor([0.3, 0.6]))
    assert k3_kl(a, a).abs().max() == 0
    assert (k3_kl(a, a.flip(0)) > 0).all()
    loss, stats = grpo_loss(a, a, torch.zeros(2), torch.tensor([0, 1]), ref_logp=a.flip(0), kl_coef=0.5)
    assert stats.kl > 0 and loss.item() == pytest.approx(0.5 * k3_kl(a, a.flip(0)).mean().item())


def test_turn_returns_discount_the_future():
    from mazerl.rl.grpo import turn_returns

    assert turn_returns([0.0, 0.0, 1.0], 0.5) == [0.25, 0.5, 1.0]
    assert turn_returns([0.1, -0.1, 1.0], 1.0) == pytest.approx([1.0, 0.9, 1.0])
    assert turn_returns([], 0.9) == []


def test_state_groups_credit_the_move_made_from_a_shared_state():
    from mazerl.rl.grpo import state_group_advantages

    # one maze, three episodes; all start in state "s" (turn 0); episode 0 then wins, 1 and 2 lose
    keys = [["s", "a"], ["s", "b"], ["s", "b"]]
    rewards = [[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]
    adv = state_group_advantages([0, 0, 0], keys, rewards, gamma=1.0)
    # turn 0 from "s": returns 1, 0, 0 -> normalised; "a" is seen once -> 0; "b" twice, same return -> 0
    assert adv[0][0] > 0 > adv[1][0] and adv[1][0] == adv[2][0]
    assert adv[0][1] == adv[1][1] == adv[2][1] == 0.0
    assert sum(adv[i][0] for i in range(3)) == pytest.approx(0.0, abs=1e-9)
    # the same key in another maze group is another state
    adv = state_group_advantages([0, 1, 1], keys, rewards, gamma=1.0)
    assert adv[0][0] == 0.0 and adv[1][0] == adv[2][0] == 0.0


def test_turn_state_keys_follow_position_previous_move_and_bump():
    from types import SimpleNamespace

    from mazerl.rl.trainer import turn_state_keys

    stats = SimpleNamespace(path=[(1, 1), (1, 1), (1, 3), (1, 3)], actions=["up", "right", "stop"])
    traj = SimpleNamespace(stats=stats, rewards=[0.0, 0.0, 0.0])
    assert turn_state_keys(traj) == [((1, 1), None, False), ((1, 1), "up", True), ((1, 3), "right", False)]


def _advantages(trajs, episode_adv, **settings):
    from types import SimpleNamespace

    from mazerl.rl.config import GRPOConfig
    from mazerl.rl.trainer import GRPOTrainer

    cfg = GRPOConfig.model_validate({"policy": {"model": "unused"}, "train_data": "x", "output_dir": "y", **settings})
    return GRPOTrainer.turn_advantages(SimpleNamespace(cfg=cfg), trajs, torch.tensor(episode_adv))


def test_episode_and_turn_weights_and_positive_only():
    from types import SimpleNamespace

    def traj(path, actions, rewards):
        return SimpleNamespace(group=0, rewards=rewards, stats=SimpleNamespace(path=path, actions=actions))

    # two episodes from the same start: the first move "right" gains, "up" bumps
    trajs = [traj([(1, 1), (1, 3)], ["right"], [0.1]), traj([(1, 1), (1, 1)], ["up"], [-0.1])]
    both = _advantages(trajs, [0.5, -0.5], turn_advantage_weight=1.0, turn_gamma=0.0)
    assert both[0][0] == pytest.approx(0.5 + 1.0, abs=1e-5) and both[1][0] == pytest.approx(-0.5 - 1.0, abs=1e-5)
    turn_only = _advantages(trajs, [0.5, -0.5], episode_advantage_weight=0.0, turn_advantage_weight=1.0, turn_gamma=0.0)
    assert turn_only[0][0] == pytest.approx(1.0, abs=1e-5) and turn_only[1][0] == pytest.approx(-1.0, abs=1e-5)
    positive = _advantages(trajs, [0.5, -0.5], positive_advantages_only=True)
    assert positive == [[0.5], [0.0]]
    with pytest.raises(ValueError, match="both 0"):
        _advantages(trajs, [0.5, -0.5], episode_advantage_weight=0.0)


def test_group_turn_baseline_credits_moves_from_states_seen_once():
    from types import SimpleNamespace

    def traj(group, path, actions, rewards):
        return SimpleNamespace(group=group, rewards=rewards, stats=SimpleNamespace(path=path, actions=actions))

    # second turns from different squares: the state baseline has nothing to compare them with
    trajs = [traj(0, [(1, 1), (1, 3), (3, 3)], ["right", "down"], [0.1, 0.1]),
             traj(0, [(1, 1), (3, 1), (3, 1)], ["down", "down"], [0.1, -0.1]),
             traj(1, [(1, 1), (1, 1)], ["up"], [-0.1])]
    by_state = _advantages(trajs, [0.0, 0.0, 0.0], episode_advantage_weight=0.0, turn_advantage_weight=1.0, turn_gamma=0.0)
    assert by_state[0] == [0.0, 0.0] and by_state[1] == [0.0, 0.0]  # first moves tie; second moves seen once
    by_group = _advantages(trajs, [0.0, 0.0, 0.0], episode_advantage_weight=0.0, turn_advantage_weight=1.0,
                           turn_gamma=0.0, turn_baseline="group")
    # group 0's four moves: three gained (+0.1), one walked back (-0.1); mean 0.05, std ~0.0866
    gained, lost = (0.1 - 0.05) / 0.0866025, (-0.1 - 0.05) / 0.0866025
    assert by_group[0] == pytest.approx([gained, gained], abs=1e-4)
    assert by_group[1] == pytest.approx([gained, lost], abs=1e-4)
    assert by_group[2] == [0.0]  # a group of one move: nothing to compare with
    with pytest.raises(ValueError, match="turn_baseline"):
        _advantages(trajs, [0.0] * 3, turn_advantage_weight=1.0, turn_baseline="batch")
