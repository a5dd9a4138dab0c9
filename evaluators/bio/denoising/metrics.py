"""OpenProblems v1's denoising metrics computed exactly as the published numbers were (docs/method.md §5d),
the normalisation by the per-split baselines, the validity checks, and the released code's
acceptance and reward.

- MSE: each row of `test` and of the denoised matrix scaled to sum 1e4 (scanpy's
  `normalize_total(target_sum=1e4)`: a row that sums to 0 stays 0), `log1p`, then the mean
  squared difference over all entries (sklearn's `mean_squared_error`).
- Poisson: `D' = D * sum(test) / sum(train)`, then `mean(T - D' * ln(T + 1e-6))` over all entries.
  OpenProblems calls molecular-cross-validation's `poisson_nll_loss(y_pred, y_true)` with its two
  arguments swapped (the test counts as the prediction), and the published scores keep that, so
  this is not the Poisson negative log-likelihood of the denoised matrix; it is what was published.
- Normalised metric: `(m_none - m) / (m_none - m_perfect)`, not clipped, with the baselines "no
  denoising" (D = train) and "perfect" (D = test) of the same split; score: the mean of the two.
- The released code rejects an output that is non-finite, negative or has a value above the train
  matrix's total (and we: one of another shape, not real numbers, with subnormal values, or all
  zero), accepts it only when its normalised Poisson is in [0.97, 1], and rewards 1 / MSE.
- Our reward adds validity rules. The count-scale rule (docs/method.md §5d "The count-scale
  rule"): the published Poisson ties the output's scale to the train total, so an output shrunk
  towards zero passes its gate whatever it holds, and the MSE ignores each row's scale. The rule
  puts the output on the held-out counts' scale (`lambda = D * sum(T) / sum(D)`) and takes the
  Poisson negative log-likelihood of the held-out counts under it, arguments in the right order,
  `mean(lambda - T ln(lambda + 1e-6))`, normalised by the same two baselines; an output must reach
  COUNT_POISSON_MIN, i.e. predict the held-out molecules clearly better than the train counts do.
  Scaling the output (towards zero or anywhere) changes nothing in it, so scale buys nothing.
- The likelihood rule (docs/method.md §5d "The likelihood rule"): the published MSE (log of row-normalised
  values) rewards sharpening any valid output (raising it to a power > 1), which makes the output too
  sure and costs count-scale likelihood; the output's normalised count-scale Poisson must reach
  LIKELIHOOD_SHARE of the MAGIC seed's on the same split (computed here, in Baselines.of).
- The calibration rule (docs/method.md §5d "The calibration rule"): an output that passes the likelihood rule
  can still spend likelihood it gained elsewhere (a little of the gene means or of each cell's own profile
  mixed into MAGIC) on sharpening. The power `q*` that maximises the likelihood of the held-out counts under the
  output's per-cell profiles (`calibration_power`, `profile_poisson`: what the MSE sees) says how sharp it is:
  raising an output to the power p divides its `q*` by p, scaling its rows changes nothing. An output sharper
  than the MAGIC seed is also scored flattened to MAGIC's sharpness, raised to `q*(D) / q*(MAGIC seed)`, and the
  reward is 1 / max(MSE, that MSE): sharpening any output beyond MAGIC's sharpness, by any power, earns nothing;
  the MAGIC seed, and any output no sharper, is scored as before.
- And the dropout rule (docs/method.md §5d "The dropout rule"): among the entries whose train
  count is 0, the output must rank those that hold held-out molecules above those that do not
  (AUC >= DROPOUT_AUC_MIN). Any function of each entry's own train count (the input scaled,
  sharpened, with a pseudocount) is constant there, AUC 0.5: it is not a denoising.

Everything is computed in float64 on the host, never in the candidate's process.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evaluators.base import EvalResult
from evaluators.bio.denoising.split import Split

TARGET_SUM = 1e4  # scanpy normalize_total(target_sum=10000) in OpenProblems' mse metric
POISSON_EPS = 1e-6  # molecular-cross-validation's poisson_nll_loss: log(y_pred + 1e-6)
POISSON_ACCEPTED = (0.97, 1.0)  # App. E: "we reject all the solutions that obtain a normalized Poisson lower than 0.97 or larger than 1"
MSE_FLOOR = 1e-12  # 1 / MSE stays finite for an output equal to the held-out counts
DROPOUT_AUC_MIN = 0.55  # docs/method.md §5d dropout rule: the least AUC on train-zero entries (0.5: a constant; MAGIC 0.77, ALRA 0.66-0.70)
COUNT_POISSON_MIN = (
    0.2  # docs/method.md §5d count-scale rule: a valid output goes at least a fifth of the way from no denoising to the held-out counts
)
LIKELIHOOD_SHARE = (
    0.985  # docs/method.md §5d likelihood rule: the least share of the MAGIC seed's normalised count-scale Poisson on the same split
)
CALIBRATION_POWERS = (
    0.05,
    5.0,
)  # docs/method.md §5d calibration rule: the powers searched for the one that maximises the profile likelihood
CALIBRATION_TOLERANCE = 1e-7  # ... to this absolute precision (the likelihood is convex in the power)
SAME_SHARPNESS = 1e-6  # ... a ratio q*(D) / q*(MAGIC seed) this close to 1 is 1: the search's precision, so that the
# MAGIC seed run elsewhere (other BLAS, last bits apart) keeps its 1 / MSE exactly
BASELINE_PROGRAM = "magic"  # docs/method.md §5d likelihood rule: the honest baseline (programs/magic.py, the seed), run on the host


def _log_normalized(X: np.ndarray) -> np.ndarray:
    """scanpy's normalize_total(target_sum=1e4) then log1p, on a dense float64 matrix."""
    factor = X.sum(axis=1) / TARGET_SUM
    factor = factor + (factor == 0)  # scanpy: a row summing to 0 is divided by 1 and stays 0
    return np.log1p(X / factor[:, None])


def mse(test: np.ndarray, denoised: np.ndarray) -> float:
    """docs/method.md §5d: mean squared difference of the log-normalised test and denoised matrices."""
    return float(np.mean((_log_normalized(test) - _log_normalized(denoised)) ** 2))


def poisson(train_total: float, test: np.ndarray, denoised: np.ndarray) -> float:
    """docs/method.md §5d: OpenProblems' Poisson figure, its arguments swapped as published:
    mean(T - D' ln(T + 1e-6)) with D' = D * sum(test) / sum(train)."""
    scaled = denoised * (test.sum() / train_total)
    return float(np.mean(test - scaled * np.log(test + POISSON_EPS)))


def count_poisson(test: np.ndarray, denoised: np.ndarray) -> float:
    """docs/method.md §5d count-scale rule: mean(L - T ln(L + 1e-6)) with L = D * sum(T) / sum(D), the
    Poisson negative log-likelihood of the held-out counts T under the output put on their scale."""
    rate = denoised * (test.sum() / denoised.sum())
    return float(np.mean(rate - test * np.log(rate + POISSON_EPS)))


def powered(denoised: np.ndarray, power: float) -> np.ndarray:
    """docs/method.md §5d calibration rule: D ** power on the positive entries (0 stays 0), each row divided by its
    largest entry ** power (the rule and the MSE see each row's profile only; dividing keeps every power in range)."""
    positive = denoised > 0
    logs = np.where(positive, np.log(np.where(positive, denoised, 1.0)), -np.inf)
    top = logs.max(axis=1, keepdims=True)
    return np.where(positive, np.exp(power * (logs - np.where(np.isfinite(top), top, 0.0))), 0.0)


def profile_poisson(test: np.ndarray, denoised: np.ndarray) -> float:
    """docs/method.md §5d calibration rule: mean(L - T ln(L + 1e-6)) with L each row of D scaled to that row's held-out
    total: the Poisson negative log-likelihood of the held-out counts under the output's per-cell profiles, which are
    all the MSE sees (a row of D that is all zero predicts nothing)."""
    rows = denoised.sum(axis=1, keepdims=True)
    rate = denoised * (test.sum(axis=1, keepdims=True) / np.where(rows > 0, rows, 1.0))
    return float(np.mean(rate - test * np.log(rate + POISSON_EPS)))


def calibration_power(test: np.ndarray, denoised: np.ndarray) -> float:
    """docs/method.md §5d calibration rule: q* = argmin over q in CALIBRATION_POWERS of profile_poisson(T, D ** q).
    Up to the 1e-6 it is a constant - q sum(T ln D) + sum_i T_i ln sum_j D_ij ** q, convex in q, so the bounded search
    finds the one minimum; q*(D ** p) = q*(D) / p exactly, and scaling the rows of D changes nothing."""
    from scipy.optimize import minimize_scalar

    low, high = CALIBRATION_POWERS
    found = minimize_scalar(
        lambda q: profile_poisson(test, powered(denoised, q)),
        bounds=(low, high),
        method="bounded",
        options={"xatol": CALIBRATION_TOLERANCE},
    )
    return float(found.x)


def calibrated_mse(test: np.ndarray, denoised: np.ndarray, magic_power: float) -> tuple[float, float]:
    """docs/method.md §5d calibration rule: (q*(D), the MSE of D raised to min(1, q*(D) / q*(MAGIC seed))): the
    output flattened to the MAGIC seed's sharpness where it is sharper. For D = S ** p sharper than MAGIC the power
    is q*(S) / p and the output scored is S ** (q*(S) / q*(MAGIC seed)), whatever p; an output no sharper than
    MAGIC (the MAGIC seed included) is scored as it is."""
    power = calibration_power(test, denoised)
    exponent = min(1.0, power / magic_power)
    return power, mse(test, denoised if abs(exponent - 1.0) <= SAME_SHARPNESS else powered(denoised, exponent))


def dropout_auc(train: np.ndarray, test: np.ndarray, denoised: np.ndarray) -> float | None:
    """docs/method.md §5d dropout rule: the AUC with which the output, on the entries whose train count is 0,
    ranks those holding held-out molecules above the rest (ties count half); None without both kinds."""
    from scipy.stats import rankdata

    zero = train == 0
    hit = test[zero] > 0
    n_hit = int(hit.sum())
    n_miss = int(hit.size - n_hit)
    if n_hit == 0 or n_miss == 0:
        return None
    ranks = rankdata(denoised[zero])  # average ranks: ties count half (Mann-Whitney)
    return float((ranks[hit].sum() - n_hit * (n_hit + 1) / 2.0) / (n_hit * n_miss))


def normalized(value: float, none: float, perfect: float) -> float:
    """docs/method.md §5d: (m_none - m) / (m_none - m_perfect): 0 for no denoising, 1 for perfect, not clipped."""
    return (none - value) / (none - perfect)


@dataclass(frozen=True)
class Baselines:
    """The metrics of "no denoising" (D = train) and "perfect" (D = test) on one split."""

    mse_none: float
    poisson_none: float
    mse_perfect: float
    poisson_perfect: float
    count_poisson_none: float  # the count-scale rule's figure of D = train
    count_poisson_perfect: float  # ... and of D = test
    count_poisson_magic: float  # the normalised count-scale Poisson of the MAGIC seed on this split (the likelihood rule's reference)
    calibration_power_magic: float  # q* of the MAGIC seed on this split (the calibration rule's reference)

    @classmethod
    def of(cls, split: Split) -> Baselines:
        """The baselines of `split`; runs the MAGIC seed (our own code) here, on the host, on its train half."""
        from evaluators.bio.denoising.sources import run_program

        none, perfect = count_poisson(split.test, split.train), count_poisson(split.test, split.test)
        seed = np.asarray(run_program(BASELINE_PROGRAM, split), dtype=np.float64)
        magic = count_poisson(split.test, seed)
        return cls(
            mse_none=mse(split.test, split.train),
            poisson_none=poisson(split.train_total, split.test, split.train),
            mse_perfect=mse(split.test, split.test),
            poisson_perfect=poisson(split.train_total, split.test, split.test),
            count_poisson_none=none,
            count_poisson_perfect=perfect,
            count_poisson_magic=normalized(magic, none, perfect),
            calibration_power_magic=calibration_power(split.test, seed),
        )


def measure(split: Split, baselines: Baselines, denoised: np.ndarray) -> dict[str, float]:
    """MSE, Poisson, their normalised values and the score (published), our validity figures, and the calibration
    rule's power q* and MSE at the MAGIC seed's sharpness."""
    m = mse(split.test, denoised)
    p = poisson(split.train_total, split.test, denoised)
    c = count_poisson(split.test, denoised)
    auc = dropout_auc(split.train, split.test, denoised)
    q, m_calibrated = calibrated_mse(split.test, denoised, baselines.calibration_power_magic)
    m_norm = normalized(m, baselines.mse_none, baselines.mse_perfect)
    p_norm = normalized(p, baselines.poisson_none, baselines.poisson_perfect)
    return {
        "mse": m,
        "poisson": p,
        "mse_normalized": m_norm,
        "poisson_normalized": p_norm,
        "score": (m_norm + p_norm) / 2.0,  # docs/method.md §5d: the mean of the two normalised metrics
        "count_poisson": c,
        "count_poisson_normalized": normalized(c, baselines.count_poisson_none, baselines.count_poisson_perfect),
        "calibration_power": q,
        "mse_calibrated": m_calibrated,
    } | ({} if auc is None else {"dropout_auc": auc})  # absent when the split has no train-zero entries of both kinds


def check_denoised(value: object, split: Split) -> tuple[np.ndarray | None, str]:
    """(the output as float64, "") or (None, why it is rejected) (docs/method.md §5d validity)."""
    if not isinstance(value, np.ndarray):
        return None, f"magic_denoise returned a {type(value).__name__}, not an array"
    if value.dtype.kind not in "biuf":
        return None, f"magic_denoise returned an array of dtype {value.dtype}, not real numbers"
    if value.shape != split.shape:
        return None, f"magic_denoise returned shape {value.shape}; expected {split.shape}, the shape of its input"
    if value.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            subnormal = (value != 0) & (np.abs(value) < np.finfo(value.dtype).tiny)
        if subnormal.any():
            return None, (
                f"output has {int(subnormal.sum())} subnormal values (non-zero, below {np.finfo(value.dtype).tiny:.3g} "
                f"in {value.dtype}): write 0 or a normal number"
            )
    Y = value.astype(np.float64)
    if not np.isfinite(Y).all():
        return None, f"output has {int(np.size(Y) - np.isfinite(Y).sum())} non-finite values (NaN or inf)"
    if (Y < 0).any():
        return None, f"output has {int((Y < 0).sum())} negative values (minimum {Y.min():.6g})"
    if Y.max() > split.train_total:
        return None, f"output has a value {Y.max():.6g} above the train matrix's total {split.train_total:.6g}"
    if not Y.sum() > 0:
        return None, "output is all zero: it predicts no molecule"
    return Y, ""


def judge(split: Split, baselines: Baselines, value: object) -> EvalResult:
    """The verdict on a denoised matrix: validity, metrics, the published acceptance (normalised Poisson in
    [0.97, 1]), our count-scale, likelihood and dropout rules, and reward 1 / MSE under our calibration rule
    (docs/method.md §5d)."""
    Y, reason = check_denoised(value, split)
    if Y is None:
        return EvalResult.invalid(reason)
    metrics = measure(split, baselines, Y)
    low, high = POISSON_ACCEPTED
    if not low <= metrics["poisson_normalized"] <= high:
        return EvalResult(
            reward=0.0,
            valid=False,
            metrics=metrics,
            reason=f"normalised Poisson {metrics['poisson_normalized']:.4f} is outside [{low}, {high}] "
            f"(MSE {metrics['mse']:.6f}, score {metrics['score']:.4f})",
        )
    if not metrics["count_poisson_normalized"] >= COUNT_POISSON_MIN:
        return EvalResult(
            reward=0.0,
            valid=False,
            metrics=metrics,
            reason=f"on the count scale the output predicts the held-out counts too little better than the train counts: "
            f"normalised count-scale Poisson {metrics['count_poisson_normalized']:.4f} < {COUNT_POISSON_MIN} "
            f"(docs/method.md §5d; MSE {metrics['mse']:.6f}, published score {metrics['score']:.4f})",
        )
    floor = LIKELIHOOD_SHARE * baselines.count_poisson_magic
    if not metrics["count_poisson_normalized"] >= floor:
        return EvalResult(
            reward=0.0,
            valid=False,
            metrics=metrics,
            reason=f"the output predicts the held-out molecules less well than the MAGIC seed does: normalised count-scale "
            f"Poisson {metrics['count_poisson_normalized']:.4f} < {LIKELIHOOD_SHARE} x the MAGIC seed's "
            f"{baselines.count_poisson_magic:.4f} = {floor:.4f} (a sharpened output lowers the MSE but not this; "
            f"docs/method.md §5d likelihood rule; MSE {metrics['mse']:.6f})",
        )
    auc = metrics.get("dropout_auc")
    if auc is not None and not auc >= DROPOUT_AUC_MIN:
        return EvalResult(
            reward=0.0,
            valid=False,
            metrics=metrics,
            reason=f"the output says nothing about the entries with no train molecule: it ranks those holding held-out "
            f"molecules with AUC {auc:.4f} < {DROPOUT_AUC_MIN} (0.5: a constant there, as any function of each entry's "
            f"own count is; docs/method.md §5d dropout rule)",
        )
    return EvalResult(reward=reward_of(metrics), valid=True, metrics=metrics)


def reward_of(metrics: dict[str, float]) -> float:
    """The reward of a valid output: the released code's 1 / MSE, with the MSE taken no lower than the output's MSE
    flattened to the MAGIC seed's sharpness (docs/method.md §5d calibration rule)."""
    return 1.0 / max(metrics["mse"], metrics["mse_calibrated"], MSE_FLOOR)
