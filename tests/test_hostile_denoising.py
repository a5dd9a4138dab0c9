"""Hostile denoising candidates (docs/method.md §5d "What the reward guarantees"): one suite per class of
attack found against the reward, each asserting the attack earns no more than the honest MAGIC seed
(and 0 where its output is not a real answer).

1. Inverting the split: `RandomState(seed).binomial` draws one uniform per entry, so a candidate
   that knows (or guesses) the generator's seed recovers ~97% of the held-out counts from the train
   counts. The split's seed is keyed with the full counts and never reaches the candidate.
2. Scale: the published Poisson gate accepts any output shrunk towards zero and the MSE ignores
   each row's scale; the count-scale rule rejects an output that is not a real denoising, and the
   dropout rule any function of each entry's own train count (a pseudocount added included).
   Sharpening: the published MSE prefers any valid output raised to a power > 1 (or masked to its
   largest entries); the likelihood rule holds the output to 0.985 of the MAGIC seed's count-scale
   likelihood, which sharpening lowers. Sharpening paid for by mixing: a little of each cell's own
   profile or of the gene means raises MAGIC's likelihood, and the surplus bought sharpening; the
   calibration rule scores every output also at the MAGIC seed's sharpness, so a power earns nothing.
3. Malformed output: whatever bytes the candidate writes (a header declaring a petabyte, a
   truncated array, an object array that would need pickle, a wrong dtype) get a verdict with a
   reason, never an exception and never an allocation the header asked for.
4. Reading the data: the process backend cannot hide scanpy's copy of the dataset, so the problem
   refuses it unless allowed; in the container there is nothing to read.

Judge-level attacks run here, in this process; sandbox attacks run on the docker backend (skipped
where the `bio` image cannot run) and on the process backend, opted into, where the attack is not
about isolation.
"""

from __future__ import annotations

import base64
import importlib.util
import io
import os
import sys
import warnings

import numpy as np
import pytest

from discover.evaluation import judge_candidate
from evaluators.bio.denoising.counts import load_counts
from evaluators.bio.denoising.metrics import Baselines, judge, mse, powered
from evaluators.bio.denoising.npy import decode_output, read_npy
from evaluators.bio.denoising.problem import DenoisingProblem
from evaluators.bio.denoising.report import run_program
from evaluators.bio.denoising.sources import CANDIDATE_RANDOM_STATE, program
from evaluators.bio.denoising.split import DEFAULT_SEED, keyed_seed, split_molecules
from evaluators.sandbox import ProcessSandbox, docker_unavailable
from tests.sandbox_backends import sandboxes_by_backend

WHY_NO_DOCKER = docker_unavailable("bio")
DOCKER = pytest.param("docker", marks=pytest.mark.skipif(bool(WHY_NO_DOCKER), reason=f"bio image not testable here: {WHY_NO_DOCKER}"))
BACKENDS = ["process", DOCKER]

# The split inversion, in the candidates' form. It tries every seed it could know or guess (its
# keyword arguments, small integers, the released code's 42, the problem's key computed from the
# train counts alone), keeps the one whose uniforms best explain the train counts, inverts the
# inversion sampler entry by entry, and adds a small smooth floor so that both Poisson figures
# accept it.
INVERSION = r'''
import hashlib
import numpy as np
from scipy.stats import binom

LOST = 0.1  # each molecule is held out with probability 0.1
FLOOR = 0.01  # weight of a rank-1 smooth floor: keeps both Poisson figures, and the likelihood rule, in range
GUESSES = list(range(0, 200)) + [42, 1234, 2024, 12345, 2**31 - 1]
KEY_DOMAIN = b"discover/denoising/split/v1\0"  # the problem's public source keys the seed like this


def key_from_train(X, seed):
    """The problem's keyed seed, computed from the train counts (the only counts a candidate has)."""
    counts = np.ascontiguousarray(np.round(X), dtype="<i8")
    digest = hashlib.sha256(KEY_DOMAIN + int(seed).to_bytes(16, "little", signed=True)
                            + np.asarray(counts.shape, dtype="<i8").tobytes() + counts.tobytes())
    return np.frombuffer(digest.digest(), dtype="<u4").astype(np.uint32)


def evidence(U, X):
    """Under the split's own seed, an entry that kept fewer of its gene's molecules drew a larger uniform."""
    seen = X.ravel() > 0
    z = (X / np.maximum(X.mean(axis=0), 1e-9)).ravel()[seen]
    return float(np.corrcoef(U[seen], z)[0, 1])


def invert(U, X, k_max=12):
    """Per entry the smallest k with CDF(k - 1; t + k, 0.1) < U <= CDF(k; t + k, 0.1)."""
    t = X.ravel()
    held = np.full(t.shape, -1.0)
    for k in range(k_max + 1):
        lo = binom.cdf(k - 1, t + k, LOST) if k else np.zeros_like(t)
        hit = (held < 0) & (U > lo) & (U <= binom.cdf(k, t + k, LOST))
        held[hit] = k
    return np.maximum(held, 0).reshape(X.shape)


def magic_denoise(X, **kwargs):
    guesses = [v for v in kwargs.values() if isinstance(v, int)] + GUESSES
    seeds = [(s, s) for s in dict.fromkeys(guesses)] + [(f"key({s})", key_from_train(X, s)) for s in (42, 0)]
    best = None
    for name, seed in seeds:
        U = np.random.RandomState(seed).random_sample(X.size)
        e = evidence(U, X)
        if best is None or e < best[0]:
            best = (e, name, U)
    print(f"inversion: best seed {best[1]}, evidence {best[0]:.4f}", flush=True)
    smooth = X.sum(axis=1, keepdims=True) * X.mean(axis=0, keepdims=True) * X.shape[0] / X.sum()
    return invert(best[2], X) + FLOOR * smooth
'''


def _load(code: str, name: str):
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    exec(compile(code, name, "exec"), module.__dict__)
    return module


@pytest.fixture(scope="module")
def problem() -> DenoisingProblem:
    p = DenoisingProblem()
    p.prepared()
    return p


@pytest.fixture(scope="module")
def honest(problem) -> float:
    """The honest MAGIC seed's reward on the problem's split (computed here, outside any sandbox)."""
    verdict = problem.score_output(run_program("magic", problem.prepared().split))
    assert verdict.valid, verdict.reason
    return verdict.reward


@pytest.fixture(scope="module")
def boxes():
    yield from sandboxes_by_backend("bio")


def _evaluate(problem: DenoisingProblem, code: str, box):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the process backend's isolation warning
        return judge_candidate(problem, code, None, box, "hostile")


# 1. Inverting the split -----------------------------------------------------------------------


def test_the_inversion_recovers_the_held_out_counts_of_an_unkeyed_split_and_would_beat_magic(honest) -> None:
    """The attack is real: on OpenProblems' own split (RandomState(42)) it finds the seed among its
    guesses and earns several times the honest reward. The problem's split is keyed against it."""
    counts = load_counts().X
    split = split_molecules(counts, DEFAULT_SEED, keyed=False)
    denoised = _load(INVERSION, "inversion").magic_denoise(split.train.copy(), random_state=DEFAULT_SEED)
    verdict = judge(split, Baselines.of(split), denoised)
    assert np.mean(np.round(denoised) == split.test) > 0.9
    assert verdict.valid and verdict.reward > 1.5 * honest, verdict.reason  # 0.61 (1 / MSE 0.83: the calibration rule flattens it)


def test_the_inversion_gets_no_more_than_magic_on_the_keyed_split(problem, honest) -> None:
    split = problem.prepared().split
    denoised = _load(INVERSION, "inversion").magic_denoise(split.train.copy(), random_state=CANDIDATE_RANDOM_STATE)
    verdict = problem.score_output(denoised)
    assert np.mean(np.round(denoised) == split.test) < 0.95  # about what guessing "0 held out" gives
    assert verdict.reward <= honest, (verdict.reward, verdict.reason)


def test_no_seed_a_candidate_can_know_generates_the_problems_split(problem) -> None:
    split = problem.prepared().split
    counts = load_counts().X
    train = np.round(split.train).astype(np.int64)
    guesses = [CANDIDATE_RANDOM_STATE, DEFAULT_SEED, *range(50), keyed_seed(train, DEFAULT_SEED), keyed_seed(train, 0)]
    for guess in guesses:
        assert not np.array_equal(np.random.RandomState(guess).binomial(counts, 0.9), split.train)
    # the key needs the full counts: the same configured seed on other counts keys another split
    assert not np.array_equal(keyed_seed(counts, DEFAULT_SEED), keyed_seed(train, DEFAULT_SEED))
    assert "42" not in problem.description.split("random_state=")[1][:4]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_inversion_in_the_sandbox_gets_no_more_than_magic(problem, honest, boxes, backend) -> None:
    verdict = _evaluate(problem, INVERSION, boxes(backend))
    assert "inversion: best seed" in verdict.observation, verdict.reason + verdict.observation[-2000:]
    assert verdict.reward <= honest, (verdict.reward, verdict.reason)


# 2. Scale -------------------------------------------------------------------------------------

SCALES = (1.0, 1e-3, 1e-9, 1e-30, 1e-200)


def _sharpened(X: np.ndarray, power: float, scale: float) -> np.ndarray:
    return scale * X**power


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("power", (1.0, 1.25, 1.5, 2.0, 3.0))
def test_the_input_scaled_or_sharpened_is_no_answer(problem, scale, power) -> None:
    """No denoising at all, at any scale and sharpened: reward 0, whatever the published gate says."""
    split = problem.prepared().split
    verdict = problem.score_output(_sharpened(split.train, power, scale))
    assert verdict.reward == 0.0 and not verdict.valid, verdict.metrics


@pytest.mark.parametrize("floor", ("constant", "cell depth"))
@pytest.mark.parametrize("power", (0.5, 1.0, 2.0, 3.0))
def test_the_input_with_a_pseudocount_scaled_is_no_answer(problem, power, floor) -> None:
    """A function of each entry's own count (plus at most its cell's depth) says nothing about the
    entries where no molecule was seen: reward 0, whatever pseudocount and scale."""
    X = problem.prepared().split.train
    extra = np.ones_like(X) if floor == "constant" else np.ones_like(X) * X.sum(axis=1, keepdims=True) / X.shape[1]
    for pseudocount in (0.001, 0.01, 0.1, 1.0):
        verdict = problem.score_output((X**power + pseudocount * extra) * 1e-6)
        assert verdict.reward == 0.0, (pseudocount, verdict.metrics)


def test_the_scaled_input_passes_the_published_gate_so_the_count_scale_rule_is_what_rejects_it(problem) -> None:
    verdict = problem.score_output(problem.prepared().split.train * 1e-9)
    assert 0.97 <= verdict.metrics["poisson_normalized"] <= 1.0  # the published rule would accept it
    assert "count-scale Poisson" in verdict.reason and verdict.reward == 0.0


@pytest.mark.parametrize("scale", (1.0, 1e-6))
def test_magic_is_valid_at_its_own_scale_and_scaling_it_changes_nothing(problem, scale) -> None:
    split = problem.prepared().split
    verdict = problem.score_output(run_program("magic", split) * scale)
    assert verdict.valid, verdict.reason
    assert verdict.metrics["count_poisson_normalized"] >= 0.3 and verdict.metrics["dropout_auc"] >= 0.6


def test_alra_is_rejected_by_the_likelihood_rule_a_documented_trade_off(problem) -> None:
    """ALRA predicts the held-out molecules clearly worse than MAGIC (normalised count-scale Poisson 0.42
    against 0.54 on split seed 42): under the likelihood rule it scores 0 (docs/method.md §5d)."""
    verdict = problem.score_output(run_program("alra", problem.prepared().split))
    assert not verdict.valid and "likelihood rule" in verdict.reason, verdict.reason


SCALED_CANDIDATES = {
    "input x 1e-9": "def magic_denoise(X, **kw):\n    return X * 1e-9\n",
    "sharpened, scaled": "def magic_denoise(X, **kw):\n    return X ** 2 * 1e-6\n",
    "sharpened 1.5, scaled": "def magic_denoise(X, **kw):\n    return X ** 1.5 * 1e-3\n",
    "sharpened, a pseudocount, scaled": "def magic_denoise(X, **kw):\n    return (X ** 2 + 0.1) * 1e-6\n",
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(SCALED_CANDIDATES))
def test_scaled_candidates_in_the_sandbox_get_0(problem, boxes, backend, case) -> None:
    verdict = _evaluate(problem, SCALED_CANDIDATES[case], boxes(backend))
    assert verdict.reward == 0.0 and not verdict.valid
    assert "count-scale Poisson" in verdict.reason or "no train molecule" in verdict.reason, verdict.reason


# 2b. Sharpening ------------------------------------------------------------------------------
# The published MSE (log of row-normalised values) rewards making any valid output more contrasted;
# the likelihood rule holds the output to the MAGIC seed's count-scale likelihood, which sharpening
# lowers (docs/method.md §5d "The likelihood rule").

SHARPENED = {
    # the input squared, each cell rescaled to its total, plus 0.01 x the gene means, scaled down
    "crude sharpened": (
        "import numpy as np\n"
        "def magic_denoise(X, **kw):\n"
        "    S = X ** 2 * (X.sum(axis=1) / np.maximum((X ** 2).sum(axis=1), 1e-300))[:, None]\n"
        "    return (S + 0.01 * X.mean(axis=0)[None, :]) * 1e-6\n"
    ),
}
MAGIC_THEN = (  # the MAGIC seed's source, then its output transformed by `{body}` (M: the MAGIC output)
    "\n_magic = magic_denoise\n\ndef magic_denoise(X, **kw):\n    M = _magic(X, **kw)\n{body}"
)
MAGIC_TRANSFORMS = {
    "MAGIC^1.5": "    return M ** 1.5\n",
    "MAGIC^1.2": "    return M ** 1.2\n",
    "MAGIC^1.05": "    return M ** 1.05\n",
    "MAGIC top-400 per cell": (
        "    out = np.zeros_like(M)\n"
        "    keep = np.argsort(-M, axis=1)[:, :400]\n"
        "    rows = np.arange(M.shape[0])[:, None]\n"
        "    out[rows, keep] = M[rows, keep]\n"
        "    return out\n"
    ),
    "MAGIC, the lower half of each cell zeroed": "    return np.where(M < np.quantile(M, 0.5, axis=1)[:, None], 0.0, M)\n",
    "MAGIC x (1 + X)": "    return M * (1.0 + X)\n",
}
for _name, _body in MAGIC_TRANSFORMS.items():
    SHARPENED[_name] = program("magic") + MAGIC_THEN.format(body=_body)


@pytest.mark.parametrize("case", list(SHARPENED))
def test_sharpened_outputs_get_no_more_than_magic(problem, honest, case) -> None:
    """Each of these has a lower MSE than MAGIC (reward 0.33 to 0.55 without the rule, MAGIC 0.32)."""
    module = _load(SHARPENED[case], case)
    denoised = module.magic_denoise(problem.prepared().split.train.copy(), random_state=CANDIDATE_RANDOM_STATE)
    verdict = problem.score_output(denoised)
    assert verdict.metrics["mse"] < 1.0 / honest, verdict.metrics  # the attack is real: the published MSE prefers it
    assert verdict.reward == 0.0 and not verdict.valid, (verdict.reward, verdict.reason)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["crude sharpened", "MAGIC^1.5", "MAGIC top-400 per cell"])
def test_sharpened_candidates_in_the_sandbox_get_no_more_than_magic(problem, honest, boxes, backend, case) -> None:
    verdict = _evaluate(problem, SHARPENED[case], boxes(backend))
    assert verdict.reward <= honest and verdict.reward == 0.0, (verdict.reward, verdict.reason)
    assert "likelihood rule" in verdict.reason, verdict.reason


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["magic seed", "magic-impute"])
def test_magic_and_magic_impute_stay_valid_in_the_sandbox(problem, honest, boxes, backend, case) -> None:
    code = program("magic") if case == "magic seed" else program("magic_impute")
    verdict = _evaluate(problem, code, boxes(backend))
    assert verdict.valid, verdict.reason
    assert verdict.reward == pytest.approx(honest, rel=0.01)


# 2c. Sharpening paid for by mixing ------------------------------------------------------------
# A little of each cell's own profile or of the gene means mixed into MAGIC raises its count-scale
# likelihood above MAGIC's (MAGIC is sharper than its likelihood's best); the surplus, spent on
# sharpening, passed the likelihood rule with up to +7% over the honest seed. The calibration rule
# scores every output also at the MAGIC seed's sharpness (docs/method.md §5d "The calibration rule"):
# a power earns nothing, and what is left is what the mixed shape itself earns there.

GAMING_BOUND = 1.04  # docs/method.md §5d calibration rule: the documented bound, a share of the MAGIC seed's reward
MIX_THEN_SHARPEN = (  # MAGIC's per-cell profile mixed with the cell's own profile and the gene means, raised to a power
    "    tot = M.sum(axis=1, keepdims=True)\n"
    "    own = X / np.maximum(X.sum(axis=1, keepdims=True), 1e-300)\n"
    "    genes = X.mean(axis=0) / X.mean(axis=0).sum()\n"
    "    return ((1 - {own} - {genes}) * M / tot + {own} * own + {genes} * genes[None, :]) ** {power} * tot\n"
)
# Re-splits its own train counts, runs MAGIC on the larger part and picks the mix and the power whose
# reward on the smaller part is the largest under the likelihood rule (with a margin); ADAPTIVE also
# scores the calibration rule there, as the evaluator's source publishes it.
SELF_TUNED = r"""
from scipy.optimize import minimize_scalar

MIXES = [(a, g) for a in (0.0, 0.05, 0.1, 0.2) for g in (0.0, 0.05, 0.1)]  # weights of the own profile, the gene means
POWERS = np.arange(1.0, 1.32, 0.02)
SHARE = 0.99  # the likelihood rule's 0.985 of MAGIC's, with a margin for the re-split's noise
ADAPTIVE = {adaptive}


def lognorm(A):
    s = A.sum(axis=1, keepdims=True)
    return np.log1p(A / np.where(s == 0, 1.0, s / 1e4))


def nll(H, D):
    L = D * (H.sum() / D.sum())
    return float(np.mean(L - H * np.log(L + 1e-6)))


def profile_nll(H, D):
    rows = D.sum(axis=1, keepdims=True)
    L = D * (H.sum(axis=1, keepdims=True) / np.where(rows > 0, rows, 1.0))
    return float(np.mean(L - H * np.log(L + 1e-6)))


def powered(D, q):
    pos = D > 0
    logs = np.log(np.where(pos, D, 1.0))
    return np.where(pos, np.exp(q * (logs - logs.max(axis=1, keepdims=True))), 0.0)


def qstar(H, D):
    return minimize_scalar(lambda q: profile_nll(H, powered(D, q)), bounds=(0.05, 5.0), method="bounded").x


def mix(M, X, a, g):
    tot = M.sum(axis=1, keepdims=True)
    own = X / np.maximum(X.sum(axis=1, keepdims=True), 1e-300)
    genes = X.mean(axis=0) / X.mean(axis=0).sum()
    return (1 - a - g) * M / tot + a * own + g * genes[None, :], tot


_magic = magic_denoise


def magic_denoise(X, **kw):
    Xa = np.random.RandomState(1).binomial(X.astype(np.int64), 0.9).astype(np.float64)  # its own re-split
    H = X - Xa
    Ma = _magic(Xa, **kw)
    none, perfect = nll(H, Xa), nll(H, H)
    floor = SHARE * (none - nll(H, Ma)) / (none - perfect)
    lh = lognorm(H)
    mse = lambda D: float(np.mean((lh - lognorm(D)) ** 2))
    qm = qstar(H, Ma) if ADAPTIVE else None
    best, choice = 1.0 / mse(Ma), (0.0, 0.0, 1.0)
    for a, g in MIXES:
        S, tot = mix(Ma, Xa, a, g)
        calibrated = mse(powered(S, qstar(H, S) / qm)) if ADAPTIVE else 0.0
        for p in POWERS:
            D = S ** p * tot
            if (none - nll(H, D)) / (none - perfect) >= floor:
                r = 1.0 / max(mse(D), calibrated)
                if r > best:
                    best, choice = r, (a, g, p)
    a, g, p = choice
    print(f"self-tuned: own profile {{a}}, gene means {{g}}, power {{p:.2f}}", flush=True)
    S, tot = mix(_magic(X, **kw), X, a, g)
    return S ** p * tot
"""
MIXED_THEN_SHARPENED = {
    "MAGIC + 10% own profile, ^1.08": MAGIC_THEN.format(body=MIX_THEN_SHARPEN.format(own=0.1, genes=0.0, power=1.08)),
    "MAGIC + 5% gene means, ^1.06": MAGIC_THEN.format(body=MIX_THEN_SHARPEN.format(own=0.0, genes=0.05, power=1.06)),
    "MAGIC + 10% own, 5% gene means, ^1.12": MAGIC_THEN.format(body=MIX_THEN_SHARPEN.format(own=0.1, genes=0.05, power=1.12)),
    "self-tuned on its own re-split": SELF_TUNED.format(adaptive=False),
    "self-tuned on its own re-split, calibration rule included": SELF_TUNED.format(adaptive=True),
}
MIXED_THEN_SHARPENED = {name: program("magic") + body for name, body in MIXED_THEN_SHARPENED.items()}


@pytest.mark.parametrize("case", list(MIXED_THEN_SHARPENED))
def test_mixing_then_sharpening_earns_no_more_than_the_documented_bound(problem, honest, case) -> None:
    """Each is valid under the likelihood rule and has a lower published MSE than MAGIC (rewards +3.2%
    to +7.1% over the seed before the calibration rule); now each earns at most GAMING_BOUND x MAGIC's."""
    module = _load(MIXED_THEN_SHARPENED[case], case)
    denoised = module.magic_denoise(problem.prepared().split.train.copy(), random_state=CANDIDATE_RANDOM_STATE)
    verdict = problem.score_output(denoised)
    assert verdict.metrics["mse"] < 1.0 / honest, verdict.metrics  # the attack is real: the published MSE prefers it
    assert verdict.valid, verdict.reason  # the likelihood rule lets it through ...
    assert verdict.reward <= GAMING_BOUND * honest, (verdict.reward / honest, verdict.metrics)  # ... the calibration rule bounds it


@pytest.mark.parametrize("power", (0.9, 1.03, 1.1, 1.5))
@pytest.mark.parametrize("shape", ("MAGIC", "MAGIC + 10% own profile and gene means", "ALRA"))
def test_a_power_beyond_the_magic_seeds_sharpness_earns_nothing(problem, honest, shape, power) -> None:
    """The class: an output raised to a power that makes it sharper than MAGIC is scored as the output itself
    flattened to MAGIC's sharpness, whatever the power, and earns no more than that (MAGIC^1.03 passed the
    likelihood rule with +3%); an output no sharper than MAGIC is scored as it is."""
    prepared = problem.prepared()
    split, magic_power = prepared.split, prepared.baselines.calibration_power_magic
    if shape == "ALRA":
        S = run_program("alra", split)
    else:
        M, X = run_program("magic", split), split.train
        total = M.sum(axis=1, keepdims=True)
        mixed = 0.8 * M / total + 0.1 * X / X.sum(axis=1, keepdims=True) + 0.1 * X.mean(axis=0) / X.mean(axis=0).sum()
        S = M if shape == "MAGIC" else mixed * total
    base, raised = problem.score_output(S), problem.score_output(S**power)
    q = base.metrics["calibration_power"]
    assert raised.metrics["calibration_power"] == pytest.approx(q / power, rel=1e-4)
    if q / power < magic_power:  # sharper than MAGIC: scored at MAGIC's sharpness, the same for every such power
        at_magic = mse(split.test, powered(S, q / magic_power))
        assert raised.metrics["mse_calibrated"] == pytest.approx(at_magic, rel=1e-5)
        assert raised.reward <= (1.0 + 1e-5) / at_magic
    else:  # no sharper than MAGIC: scored as it is
        assert raised.metrics["mse_calibrated"] == raised.metrics["mse"]
        assert raised.reward in (0.0, pytest.approx(1.0 / raised.metrics["mse"], rel=1e-12))
    if shape == "MAGIC":
        assert raised.reward <= honest * (1.0 + 1e-5), raised.metrics


def test_scaling_the_rows_changes_nothing_in_the_calibration_rule(problem) -> None:
    """The MSE sees each cell's profile only, and so does the calibration rule: rows rescaled at will (to push the
    likelihood's best power towards 1) leave its power and its MSE as they were."""
    split = problem.prepared().split
    S = run_program("magic", split) ** 1.2
    rows = np.random.default_rng(0).lognormal(0.0, 1.0, size=(S.shape[0], 1))
    base, scaled = problem.score_output(S), problem.score_output(S * rows)
    assert scaled.metrics["calibration_power"] == pytest.approx(base.metrics["calibration_power"], rel=1e-5)
    assert scaled.metrics["mse_calibrated"] == pytest.approx(base.metrics["mse_calibrated"], rel=1e-9)


@pytest.mark.parametrize("name", ["magic", "magic_impute"])
def test_the_honest_denoisers_keep_the_published_reward(problem, name) -> None:
    """The MAGIC seed and magic-impute's MAGIC: the calibration rule leaves 1 / MSE unchanged (within 1%)."""
    verdict = problem.score_output(run_program(name, problem.prepared().split))
    assert verdict.valid, verdict.reason
    assert verdict.reward == pytest.approx(1.0 / verdict.metrics["mse"], rel=0.01)
    assert verdict.metrics["calibration_power"] == pytest.approx(problem.prepared().baselines.calibration_power_magic, rel=0.01)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_mixed_and_sharpened_candidate_in_the_sandbox_earns_no_more_than_the_bound(problem, honest, boxes, backend) -> None:
    verdict = _evaluate(problem, MIXED_THEN_SHARPENED["MAGIC + 10% own, 5% gene means, ^1.12"], boxes(backend))
    assert verdict.valid, verdict.reason
    assert verdict.metrics["mse"] < 1.0 / honest and verdict.reward <= GAMING_BOUND * honest, verdict.metrics


# 3. Malformed output --------------------------------------------------------------------------

PIB = 2**50  # bytes in a pebibyte


def _npy_header(descr: str, shape: tuple, fortran: bool = False, version: tuple[int, int] = (1, 0)) -> bytes:
    """The bytes of an .npy header declaring `descr` and `shape`, with no data after it."""
    text = repr({"descr": descr, "fortran_order": fortran, "shape": shape})
    size_bytes = 2 if version == (1, 0) else 4
    pad = 64 - (10 + size_bytes - 2 + len(text) + 1) % 64
    text = (text + " " * pad + "\n").encode("latin1")
    return b"\x93NUMPY" + bytes(version) + len(text).to_bytes(size_bytes, "little") + text


def _npy(array: np.ndarray, **kw) -> bytes:
    out = io.BytesIO()
    np.save(out, array, **kw)
    return out.getvalue()


def malformed(shape: tuple[int, int]) -> dict[str, tuple[bytes, str]]:
    """Each malformed output, as .npy bytes, with what its reason must say."""
    cells, genes = shape
    good = np.ones(shape)
    return {
        "1 PiB header": (_npy_header("<f8", (PIB // 8 // genes, genes)), "expected"),
        "1 PiB header, version 2": (_npy_header("<f8", (PIB // 8 // genes, genes), version=(2, 0)), "expected"),
        "right shape, a huge dtype": (_npy_header("|V1000000000", shape), "dtype"),
        "right shape, no data": (_npy_header("<f8", shape), "truncated"),
        "truncated": (_npy(good)[:-8], "truncated"),
        "padded": (_npy(good) + b"\0" * 8, "padded"),
        "object array (pickle)": (_npy(np.empty(shape, dtype=object), allow_pickle=True), "dtype object"),
        "complex": (_npy(good.astype(np.complex128)), "complex128"),
        "float128": (_npy(good.astype(np.longdouble)), "bytes per value"),
        "record": (_npy(np.zeros(shape, dtype=[("a", "<f4"), ("b", "<f4")])), "dtype"),
        "strings": (_npy(np.full(shape, "1")), "dtype <U1"),
        "not npy": (b"PK\x03\x04" + b"\0" * 100, "header could not be read"),
        "empty": (b"", "header could not be read"),
        "header not a literal": (b"\x93NUMPY\x01\x00" + (20).to_bytes(2, "little") + b"__import__('os')   \n", "header could not be read"),
        "negative shape": (_npy_header("<f8", (-1, genes)), "expected"),
        "unknown version": (b"\x93NUMPY\x07\x00" + b"\0" * 100, "not supported"),
        "version 3": (_npy_header("<f8", shape, version=(3, 0)) + good.tobytes(), "version 3.0"),
    }


def test_every_malformed_npy_is_refused_with_a_reason_before_any_allocation(problem) -> None:
    shape = problem.prepared().split.shape
    for case, (raw, says) in malformed(shape).items():
        array, reason = read_npy(raw, shape)
        assert array is None and says in reason, (case, reason)
        array, reason = decode_output({"npy": base64.b64encode(raw).decode()}, shape)
        assert array is None and says in reason, (case, reason)


def test_well_formed_outputs_read_back_exactly(problem) -> None:
    shape = problem.prepared().split.shape
    values = np.random.default_rng(0).random(shape)
    for array in (values, np.asfortranarray(values), values.astype(">f8"), values.astype(np.float32), (values * 10).astype(np.int16)):
        got, reason = read_npy(_npy(array), shape)
        assert reason == "" and got.shape == shape
        np.testing.assert_array_equal(got.astype(np.float64), np.asarray(array, dtype=np.float64))


@pytest.mark.parametrize("bad", ["base64", "no npy", "a list"])
def test_outputs_that_are_not_the_drivers_are_refused(problem, bad) -> None:
    output = {"base64": {"npy": "%%%"}, "no npy": {"array": "AAAA"}, "a list": [1, 2]}[bad]
    array, reason = decode_output(output, problem.prepared().split.shape)
    assert array is None and reason


@pytest.mark.parametrize("case", ["subnormal float64", "subnormal float32", "inf", "nan", "negative", "all zero"])
def test_values_that_are_not_counts_are_refused(problem, case) -> None:
    split = problem.prepared().split
    X = split.train.copy()
    if case == "subnormal float64":
        X *= 1e-320
    elif case == "subnormal float32":
        X = (X * 1e-42).astype(np.float32)
    elif case == "all zero":
        X[:] = 0
    else:
        X[0, 0] = {"inf": np.inf, "nan": np.nan, "negative": -1.0}[case]
    verdict = problem.score_output(X)
    assert verdict.reward == 0.0 and not verdict.valid
    says = {
        "subnormal float64": "subnormal",
        "subnormal float32": "subnormal",
        "inf": "non-finite",
        "nan": "non-finite",
        "negative": "negative",
        "all zero": "all zero",
    }[case]
    assert says in verdict.reason, verdict.reason


# A candidate that writes the return value itself (it runs in the driver's process: to the
# descriptor the harness names, else output.json) and leaves.
WRITES_ITS_OWN = r"""
import base64, json, os, sys

def magic_denoise(X, **kwargs):
    raw = base64.b64decode({raw!r})
    fd = os.environ.get("DISCOVER_OUTPUT_FD")
    with (os.fdopen(int(fd), "w") if fd else open("output.json", "w")) as f:
        json.dump({{"npy": base64.b64encode(raw).decode()}}, f)
    sys.stdout.flush()
    os._exit(0)
"""

SANDBOX_MALFORMED = ["1 PiB header", "truncated", "object array (pickle)", "right shape, a huge dtype", "header not a literal"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", SANDBOX_MALFORMED)
def test_a_malformed_npy_written_by_the_candidate_gets_a_verdict(problem, boxes, backend, case) -> None:
    shape = problem.prepared().split.shape
    raw, says = malformed(shape)[case]
    code = WRITES_ITS_OWN.format(raw=base64.b64encode(raw).decode())
    verdict = _evaluate(problem, code, boxes(backend))
    assert verdict.reward == 0.0 and not verdict.valid
    assert says in verdict.reason and "evaluator fault" not in verdict.reason, verdict.reason


# 4. Reading the data --------------------------------------------------------------------------

# Reads the full counts where it can (scanpy's copy of the offline dataset, or any copy it finds)
# and returns the held-out counts, with a small floor.
READER = r"""
import glob, os, sys
import numpy as np


def full_counts(shape):
    try:
        import scanpy as sc
        ad = sc.datasets.pbmc68k_reduced()
        print("reader: read scanpy's copy", flush=True)
        return np.round(np.expm1(ad.raw.X.toarray()) * ad.obs["n_counts"].to_numpy()[:, None] / 1e4)
    except Exception as e:
        print(f"reader: scanpy's copy unavailable ({type(e).__name__})", flush=True)
    for root in sys.path + ["/tmp", "/work", "/root", "/data", os.path.expanduser("~")]:
        for path in glob.glob(os.path.join(root, "**", "*pbmc68k*"), recursive=True)[:5]:
            print(f"reader: found {path}", flush=True)
    return None


def magic_denoise(X, **kwargs):
    full = full_counts(X.shape)
    if full is None or full.shape[0] != X.shape[0]:
        return X
    held = np.clip(full[:, : X.shape[1]] - X, 0, None)
    smooth = X.sum(axis=1, keepdims=True) * X.mean(axis=0, keepdims=True) * X.shape[0] / X.sum()
    return held + 0.003 * smooth
"""


def test_in_the_process_sandbox_a_reader_finds_nothing(problem, honest, boxes) -> None:
    """scanpy's copy of the dataset is empty in the bio view and no other copy is there: the reader
    scores no better than an honest method (issue 36; before, the problem refused this backend)."""
    verdict = _evaluate(problem.with_limits(timeout_s=300.0), READER, boxes("process"))
    # it may find the file's name (an empty file in the view, in place of scanpy's copy), not its counts
    assert "scanpy's copy unavailable" in verdict.observation, verdict.observation
    assert verdict.reward <= honest


@pytest.mark.skipif(os.geteuid() != 0, reason="the process backend runs candidates as another uid only as root")
def test_without_isolation_a_reader_does_recover_the_counts(problem, honest) -> None:
    """Why sandbox.isolation none is for trusted programs only: there the reader finds scanpy's copy
    and scores far above any honest method."""
    verdict = _evaluate(problem, READER, ProcessSandbox(isolation="none", image="bio"))
    assert "read scanpy's copy" in verdict.observation
    assert verdict.reward > 2 * honest


@pytest.mark.skipif(bool(WHY_NO_DOCKER), reason=f"bio image not testable here: {WHY_NO_DOCKER}")
def test_in_the_container_a_reader_finds_nothing(boxes, honest) -> None:
    problem = DenoisingProblem()  # not opted into anything: the docker backend is the default's
    verdict = _evaluate(problem.with_limits(timeout_s=300.0), READER, boxes("docker"))
    assert "scanpy's copy unavailable" in verdict.observation and "reader: found" not in verdict.observation, verdict.observation
    assert verdict.reward <= honest


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
