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
