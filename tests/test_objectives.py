"""Tests for discover/objectives.py (docs/method.md §2)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from discover.objectives import (
    OBJECTIVES,
    adaptive_beta,
    batch_kl_mean,
    group_advantages,
    importance_sampling_loss,
    kl_shaped_advantages,
    kl_to_uniform,
    loo_entropic_advantages,
)

GAMMA = math.log(2)


def _random_groups():
    rng = np.random.default_rng(0)
    groups = []
    for k in (3, 4, 8, 16, 64):
        for scale, shift in ((1.0, 0.0), (1e-3, 5.0), (1e3, -200.0), (1e6, 1e6)):
            groups.append(rng.normal(size=k) * scale + shift)
    return groups


def test_kl_to_uniform_hand_computed():
    # r = [0, 1], beta = ln 3: q = [1/4, 3/4]; KL = 1/4 ln(2 * 1/4) + 3/4 ln(2 * 3/4)
    expected = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)
    assert kl_to_uniform(np.array([0.0, 1.0]), math.log(3)) == pytest.approx(expected, abs=1e-12)
    assert kl_to_uniform(np.array([0.0, 1.0, 5.0]), 0.0) == pytest.approx(0.0, abs=1e-15)


@pytest.mark.parametrize("rewards", _random_groups())
def test_adaptive_beta_hits_gamma(rewards):
    beta = adaptive_beta(rewards, GAMMA)
    assert beta is not None and beta > 0
    assert abs(kl_to_uniform(rewards, beta) - GAMMA) < 1e-6


def test_adaptive_beta_other_gamma():
    r = np.array([0.1, 0.7, 0.3, 0.9, 0.2])
    beta = adaptive_beta(r, gamma=0.3)
    assert abs(kl_to_uniform(r, beta) - 0.3) < 1e-6


def test_loo_hand_computed_k3():
    # r = [0, 1, 2], beta = ln 2, r_max = 2
    # e = exp(ln2 * (r - 2)) = [1/4, 1/2, 1]
    # Z_-0 = (1/2 + 1) / 2 = 3/4   -> A_0 = (1/4) / (3/4) - 1 = -2/3
    # Z_-1 = (1/4 + 1) / 2 = 5/8   -> A_1 = (1/2) / (5/8) - 1 = -1/5
    # Z_-2 = (1/4 + 1/2) / 2 = 3/8 -> A_2 = 1 / (3/8) - 1   = 5/3
    adv = loo_entropic_advantages(np.array([0.0, 1.0, 2.0]), math.log(2))
    np.testing.assert_allclose(adv, [-2 / 3, -1 / 5, 5 / 3], rtol=0, atol=1e-9)


@pytest.mark.parametrize("w, b", [(1e-4, 0.0), (1e-4, 3.0), (1.0, -7.5), (3.7, 2.0), (1e4, -11.0), (1e4, 1e3)])
def test_adaptive_advantages_affine_invariant(w, b):
    rng = np.random.default_rng(1)
    for k in (3, 5, 16):
        r = rng.uniform(-1, 1, size=k)
        base = group_advantages(r, "entropic-adaptive")
        moved = group_advantages(w * r + b, "entropic-adaptive")
        assert np.all(np.isfinite(base.advantages))
        assert np.any(base.advantages != 0)
        np.testing.assert_allclose(moved.advantages, base.advantages, rtol=1e-9, atol=1e-9)
        assert moved.beta == pytest.approx(base.beta / w, rel=1e-9)


def test_equal_rewards_give_zero_and_none():
    r = np.full(6, 3.25)
    assert adaptive_beta(r) is None
    out = group_advantages(r, "entropic-adaptive")
    np.testing.assert_array_equal(out.advantages, np.zeros(6))
    assert math.isnan(out.beta)


def test_two_different_rewards_give_zero():
    # K = 2: KL -> ln 2 only as beta -> inf, where the better rollout's LOO advantage is 1 / eps.
    for r in ([0.0, 1.0], [3.0, -4.0]):
        assert adaptive_beta(np.array(r)) is None
        out = group_advantages(r, "entropic-adaptive")
        np.testing.assert_array_equal(out.advantages, np.zeros(2))
        assert math.isnan(out.beta)


@pytest.mark.parametrize(
    "rewards, n_best",
    [([0.0, 0.0, 1.0, 1.0], 2), ([5.0, 7.0, 7.0], 2), ([0.8174, 0.8174, 0.8174, 0.0], 3), ([0.0, 0.5, 2.0, 2.0, 2.0, 2.0], 4)],
)
def test_ties_at_the_best_still_give_a_signal(rewards, n_best):
    # sup_beta KL = log(K / #argmax) <= ln 2: gamma is unreachable, and beta is the released code's cap.
    r = np.array(rewards)
    k = r.size
    beta = adaptive_beta(r)
    assert beta is not None and np.isfinite(beta)
    assert kl_to_uniform(r, beta) <= GAMMA + 1e-12  # the tilt stays inside the KL budget
    out = group_advantages(r, "entropic-adaptive")
    best = r == r.max()
    np.testing.assert_allclose(out.advantages[best], (k - 1) / (n_best - 1) - 1, rtol=1e-9)
    np.testing.assert_allclose(out.advantages[~best], -1.0, atol=1e-9)
    moved = group_advantages(1e-3 * r + 7.0, "entropic-adaptive")  # still invariant to affine maps
    np.testing.assert_allclose(moved.advantages, out.advantages, rtol=1e-9, atol=1e-9)


def test_a_near_tie_with_the_best_counts_as_a_tie():
    # The second best 1e-12 of the range below the best: at the cap it weighs like the best.
    r = np.array([1.0, 1.0 - 1e-12, 0.0])
    beta = adaptive_beta(r)
    assert beta is not None
    adv = group_advantages(r, "entropic-adaptive").advantages
    assert adv[0] > 0 and adv[1] > 0 and adv[2] == pytest.approx(-1.0)
    assert adv[0] == pytest.approx(adv[1], rel=1e-5)


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_single_rollout_gives_zero(objective):
    out = group_advantages([4.2], objective)
    assert out.advantages.shape == (1,)
    np.testing.assert_array_equal(out.advantages, [0.0])
    assert adaptive_beta(np.array([4.2])) is None


def test_constant_beta_matches_loo():
    r = [0.3, -1.2, 2.0, 0.9]
    out = group_advantages(r, "entropic-constant")
    assert out.beta == 2.0
    np.testing.assert_allclose(out.advantages, loo_entropic_advantages(np.array(r), 2.0), rtol=0, atol=0)
    # r_max = 2.0: e = exp(2 (r - 2)); A_2 = 1 / mean(e_0, e_1, e_3) - 1 (eps = 1e-12 shifts it ~1e-11 rel)
    e = [math.exp(2 * (x - 2.0)) for x in r]
    assert out.advantages[2] == pytest.approx(1.0 / ((e[0] + e[1] + e[3]) / 3) - 1.0, rel=1e-9)
    other = group_advantages(r, "entropic-constant", constant_beta=0.5)
    assert other.beta == 0.5
    assert not np.allclose(other.advantages, out.advantages)


def test_expected_is_reward_minus_mean():
    out = group_advantages([1.0, 2.0, 6.0], "expected")
    np.testing.assert_allclose(out.advantages, [-2.0, -1.0, 3.0], rtol=0, atol=1e-12)
    assert math.isnan(out.beta)
    assert out.advantages.dtype == np.float64


def test_none_is_all_zero():
    out = group_advantages([1.0, 2.0, 6.0], "none")
    np.testing.assert_array_equal(out.advantages, np.zeros(3))
    assert math.isnan(out.beta)


def test_unknown_objective_lists_allowed_values():
    with pytest.raises(ValueError) as err:
        group_advantages([1.0, 2.0], "entropic")
    for name in OBJECTIVES:
        assert name in str(err.value)


def test_kl_shaping_formula():
    adv = torch.tensor(1.5)
    logp_policy = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    logp_base = torch.tensor([-1.5, -1.0, -0.5], requires_grad=True)
    out = kl_shaped_advantages(adv, logp_policy, logp_base, kl_coef=0.1)
    # 1.5 - 0.1 * ([-1, -2, -0.5] - [-1.5, -1, -0.5]) = 1.5 - 0.1 * [0.5, -1, 0] = [1.45, 1.6, 1.5]
    torch.testing.assert_close(out, torch.tensor([1.45, 1.6, 1.5]))
    assert not out.requires_grad
    per_token = kl_shaped_advantages(torch.tensor([1.0, 0.0, -1.0]), logp_policy, logp_base, kl_coef=0.0)
    torch.testing.assert_close(per_token, torch.tensor([1.0, 0.0, -1.0]))


def test_kl_shaping_centred_over_the_batch():
    # released code: A - lambda (d - mean(d)), the mean over the batch's masked tokens only.
    # d = [0.5, -1, 0] (masked) and [2.0 (masked), 9.0 (unmasked)] -> mean over 4 tokens = 1.5 / 4
    lp = [torch.tensor([-1.0, -2.0, -0.5]), torch.tensor([0.0, 1.0])]
    lb = [torch.tensor([-1.5, -1.0, -0.5]), torch.tensor([-2.0, -8.0])]
    masks = [torch.tensor([1, 1, 1]), torch.tensor([1, 0])]
    center = batch_kl_mean(lp, lb, masks)
    assert center == pytest.approx(0.375)
    out = kl_shaped_advantages(torch.tensor(1.5), lp[0], lb[0], kl_coef=0.1, center=center)
    # 1.5 - 0.1 * ([0.5, -1, 0] - 0.375) = [1.4875, 1.6375, 1.5375]
    torch.testing.assert_close(out, torch.tensor([1.4875, 1.6375, 1.5375]))
    assert batch_kl_mean([torch.tensor([1.0])], [torch.tensor([0.0])], [torch.tensor([0])]) == 0.0


def test_importance_sampling_loss_value_and_grad():
    logp_learner = torch.tensor([-1.0, -0.5, -2.0, -0.1], dtype=torch.float64, requires_grad=True)
    logp_sampler = torch.tensor([-1.2, -0.5, -1.0, -0.3], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([2.0, -1.0, 0.5, 3.0], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    loss = importance_sampling_loss(logp_learner, logp_sampler, adv, mask)

    ratio = [math.exp(a - b) for a, b in zip([-1.0, -0.5, -2.0, -0.1], [-1.2, -0.5, -1.0, -0.3])]
    terms = [ratio[i] * [2.0, -1.0, 0.5, 3.0][i] * [1, 1, 0, 1][i] for i in range(4)]
    assert loss.item() == pytest.approx(-sum(terms), rel=1e-12)

    loss.backward()
    # d loss / d logp_learner = -exp(logp_learner - logp_sampler) * A * mask
    torch.testing.assert_close(logp_learner.grad, torch.tensor([-t for t in terms], dtype=torch.float64))
    assert logp_learner.grad[2].item() == 0.0
    assert logp_sampler.grad is None and adv.grad is None  # constants: no gradient


def test_masked_tokens_with_bad_logprobs_get_zero_grad():
    logp_learner = torch.tensor([-1.0, float("-inf")], requires_grad=True)
    logp_sampler = torch.tensor([-1.0, -5.0])
    adv = torch.tensor([1.0, float("nan")])
    mask = torch.tensor([True, False])
    loss = importance_sampling_loss(logp_learner, logp_sampler, adv, mask)
    loss.backward()
    assert loss.item() == pytest.approx(-1.0)
    assert logp_learner.grad.tolist() == [-1.0, 0.0]


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_loss_finite_with_large_rewards(objective):
    rewards = np.array([1e6, -1e6, 3e6, 2.5e6, 0.0])
    out = group_advantages(rewards, objective)
    assert np.all(np.isfinite(out.advantages))
    n_tokens = 4
    logp_learner = torch.full((len(rewards), n_tokens), -0.7, requires_grad=True)
    logp_sampler = torch.full((len(rewards), n_tokens), -0.7)
    adv = torch.as_tensor(out.advantages, dtype=torch.float32)[:, None]
    token_adv = kl_shaped_advantages(adv, logp_learner, logp_sampler - 0.1, kl_coef=0.01)
    mask = torch.ones_like(logp_learner)
    loss = importance_sampling_loss(logp_learner, logp_sampler, token_adv, mask)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.all(torch.isfinite(logp_learner.grad))
