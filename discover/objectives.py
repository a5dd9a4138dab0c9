"""Training objectives (docs/method.md §2): per-group advantages and the token-level loss.

Group level (numpy, float64): the entropic objective with an adaptive or constant beta and
leave-one-out (LOO) advantages, the expected-reward baseline, and "none" (no training).
Token level (torch): KL shaping towards the base model and the importance-sampling loss. torch is
imported by those functions only: the configuration imports this module's names, and a process that
only reads a configuration (`discover status`, an evaluation worker) should not pay torch's import.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

OBJECTIVES = ("entropic-adaptive", "entropic-constant", "expected", "none")

LOO_EPS = 1e-12  # docs/method.md §2: eps in A_n = e_n / (Z_-n + eps) - 1
BETA_RANGE_CAP = 1e6  # docs/method.md §2: cap on u = beta * (r_max - r_min) while searching
BISECTION_MAX_ITERS = 200  # docs/method.md §2: bisection iterations (stops earlier once the interval stops shrinking)
BISECTION_REL_TOL = 1e-15  # stop when (hi - lo) <= tol * hi


def _as_rewards(rewards: Sequence[float] | np.ndarray) -> np.ndarray:
    r = np.asarray(rewards, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(r)):
        raise ValueError(f"rewards must be finite, got {r.tolist()}")
    return r


def kl_to_uniform(rewards: np.ndarray, beta: float) -> float:
    """KL(q_beta || uniform) for one group, computed with a max shift so nothing overflows."""
    r = _as_rewards(rewards)
    k = r.size
    if k < 2:
        return 0.0
    z = beta * (r - r.max())  # <= 0, so exp never overflows
    log_q = z - np.log(np.sum(np.exp(z)))  # docs/method.md §2: log q_beta(n) = beta r_n - logsumexp(beta r)
    q = np.exp(log_q)
    return float(np.sum(q * (log_q + math.log(k))))  # docs/method.md §2: KL = sum_n q(n) log(K q(n))


def adaptive_beta(rewards: np.ndarray, gamma: float = math.log(2)) -> float | None:
    """Beta >= 0 with KL(q_beta || uniform) == gamma, or the capped beta when no beta reaches gamma.

    The search runs on the dimensionless u = beta * (r_max - r_min) over range-normalised
    rewards, so the result is invariant to r -> w r + b (w > 0); beta is returned in the
    caller's units (u / range). None when no beta gives a finite signal: fewer than two
    rollouts, equal rewards, or one best reward whose KL reaches gamma only at beta = inf.
    """
    if not gamma > 0:
        raise ValueError(f"gamma must be > 0, got {gamma}")
    r = _as_rewards(rewards)
    if r.size < 2:
        return None
    span = float(r.max() - r.min())
    if span <= 0.0:
        return None  # equal rewards: q is uniform for every beta, KL = 0
    x = (r - r.min()) / span  # docs/method.md §2: normalise rewards by their range (x in [0, 1])
    n_max = int(np.count_nonzero(r == r.max()))
    if n_max == 1 and math.log(r.size) <= gamma:
        return None  # docs/method.md §2: K = 2: KL -> ln 2 only as beta -> inf, where A_best = 1 / eps

    def kl(u: float) -> float:
        return kl_to_uniform(x, u)

    # docs/method.md §2: grow the upper end by doubling (from 1.0) until the KL exceeds gamma; cap it.
    lo, hi = 0.0, 1.0
    while kl(hi) < gamma:
        lo = hi
        if hi >= BETA_RANGE_CAP:
            # docs/method.md §2: gamma unreachable (e.g. sup KL = log(K / #argmax) <= gamma): the cap, as released
            return BETA_RANGE_CAP / span
        hi = min(2.0 * hi, BETA_RANGE_CAP)

    # docs/method.md §2: bisection on u for KL(q_u || uniform) = gamma (KL is nondecreasing in u).
    for _ in range(BISECTION_MAX_ITERS):
        if hi - lo <= BISECTION_REL_TOL * hi:
            break
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if kl(mid) < gamma:
            lo = mid
        else:
            hi = mid
    u = 0.5 * (lo + hi)
    return u / span  # docs/method.md §2: beta = u / range, in the caller's units


def loo_entropic_advantages(rewards: np.ndarray, beta: float) -> np.ndarray:
    """Leave-one-out entropic advantages A_n = e_n / (Z_-n + eps) - 1 (zeros when K < 2)."""
    r = _as_rewards(rewards)
    k = r.size
    if k < 2:
        return np.zeros(k, dtype=np.float64)
    e = np.exp(beta * (r - r.max()))  # docs/method.md §2: e_n = exp(beta (r_n - r_max))
    # sum_{m != n} e_m via prefix + suffix sums (no cancellation from "total - e_n")
    before = np.concatenate(([0.0], np.cumsum(e)[:-1]))
    after = np.concatenate((np.cumsum(e[::-1])[::-1][1:], [0.0]))
    z_loo = (before + after) / (k - 1)  # docs/method.md §2: Z_-n = (sum_{m != n} e_m) / (K - 1)
    return e / (z_loo + LOO_EPS) - 1.0  # docs/method.md §2: A_n = e_n / (Z_-n + eps) - 1


@dataclass(frozen=True)
class GroupAdvantages:
    advantages: np.ndarray  # shape (K,), float64
    beta: float  # the beta used; float('nan') when not applicable (expected/none, or no beta gives a signal)


def group_advantages(
    rewards: Sequence[float],
    objective: str,
    gamma: float = math.log(2),
    constant_beta: float = 2.0,
) -> GroupAdvantages:
    """Advantages for one group of K rollouts from the same start state (docs/method.md §2)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; allowed values: {', '.join(OBJECTIVES)}")
    r = _as_rewards(rewards)
    zeros = np.zeros(r.size, dtype=np.float64)
    if objective == "none":
        return GroupAdvantages(zeros, math.nan)  # docs/method.md §2: "none": no training
    if objective == "expected":
        if r.size < 2:
            return GroupAdvantages(zeros, math.nan)
        return GroupAdvantages(r - r.mean(), math.nan)  # docs/method.md §2: expected reward, A_n = r_n - mean(r)
    if r.size < 2:
        return GroupAdvantages(zeros, math.nan)  # docs/method.md §2: K < 2 gives zero advantages
    if objective == "entropic-constant":
        beta = float(constant_beta)  # docs/method.md §2: constant beta, same LOO form
        return GroupAdvantages(loo_entropic_advantages(r, beta), beta)
    beta_or_none = adaptive_beta(r, gamma)  # docs/method.md §2: adaptive beta with KL = gamma
    if beta_or_none is None:
        return GroupAdvantages(zeros, math.nan)  # docs/method.md §2: equal rewards or K = 2 with gamma unreached
    return GroupAdvantages(loo_entropic_advantages(r, beta_or_none), beta_or_none)


def kl_shaped_advantages(
    advantage: torch.Tensor,
    logp_policy: torch.Tensor,
    logp_base: torch.Tensor,
    kl_coef: float,
    center: float = 0.0,
) -> torch.Tensor:
    """Per-token advantages A_n - lambda * (logp_policy - logp_base - center), all detached.

    `center` is 0 for the paper's formula; the released code passes the batch's mean of
    logp_policy - logp_base over all trained tokens (`batch_kl_mean`), so the KL term sums to 0.
    """
    import torch

    logp_policy = logp_policy.detach()
    logp_base = logp_base.detach()
    adv = torch.as_tensor(advantage, dtype=logp_policy.dtype, device=logp_policy.device).detach()
    # docs/method.md §2: KL shaping towards pi_0; released code (incorporate_kl_penalty): centred over the batch
    shaped = adv - kl_coef * ((logp_policy - logp_base) - center)
    return shaped.detach()


def batch_kl_sum(
    logp_policy: Sequence[torch.Tensor], logp_base: Sequence[torch.Tensor], masks: Sequence[torch.Tensor]
) -> tuple[float, int]:
    """Sum of logp_policy - logp_base over every masked token of a batch, and the number of those tokens
    (sharded training adds these over its ranks before dividing: `batch_kl_mean` of the whole batch)."""
    import torch

    total, count = 0.0, 0
    for lp, lb, m in zip(logp_policy, logp_base, masks, strict=True):
        keep = m.to(torch.bool)
        total += float((lp.detach() - lb.detach())[keep].sum())
        count += int(keep.sum())
    return total, count


def batch_kl_mean(logp_policy: Sequence[torch.Tensor], logp_base: Sequence[torch.Tensor], masks: Sequence[torch.Tensor]) -> float:
    """Mean of logp_policy - logp_base over every masked token of a batch (the released code's centre)."""
    total, count = batch_kl_sum(logp_policy, logp_base, masks)
    return total / count if count else 0.0


def importance_sampling_loss(
    logp_learner: torch.Tensor,
    logp_sampler: torch.Tensor,
    token_advantages: torch.Tensor,
    mask: torch.Tensor,
    ratio_cap: float | None = None,
) -> torch.Tensor:
    """Scalar loss -sum(exp(logp_learner - logp_sampler) * A_token * mask); grads via logp_learner only.

    `ratio_cap` truncates the importance weight (truncated importance sampling): a token whose
    ratio exceeds the cap is weighted by the cap, its gradient direction (grad log pi) kept.
    """
    import torch

    keep = mask.to(torch.bool)
    diff = logp_learner - logp_sampler.detach()
    # masked tokens get exactly zero (and zero gradient) even if their log-probs are -inf/nan
    diff = torch.where(keep, diff, torch.zeros_like(diff))
    ratio = torch.exp(diff)
    if ratio_cap is not None:  # truncated IS: weight min(ratio, cap), gradient min(ratio, cap) * grad log pi
        r = ratio.detach()
        ratio = ratio * torch.where(r > ratio_cap, ratio_cap / r, torch.ones_like(r))
    weight = mask.to(logp_learner.dtype) * token_advantages.detach().to(logp_learner.dtype)
    weight = torch.where(keep, weight, torch.zeros_like(weight))
    return -(ratio * weight).sum()  # docs/method.md §2: importance-sampling policy gradient loss
