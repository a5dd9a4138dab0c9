"""No denoising, MAGIC and ALRA on the offline PBMC counts, scored by the denoising evaluator
(docs/method.md §5d): a table of MSE, Poisson, their normalised values and the score, per split seed.

Every method but "no denoising" and "perfect" runs as a candidate through the evaluator, in the
sandbox, exactly as a run scores it: the MAGIC seed (programs/magic.py, our code), MAGIC from
magic-impute in OpenProblems' best configuration (approximate solver, reversed normalisation) as
a reference for the seed, ALRA (programs/alra.py, our code, sqrt norm, reversed normalisation;
rejected by the likelihood rule), the MAGIC seed's output raised to the power 1.5 (sharpened: a
lower MSE, rejected by the likelihood rule), and the MAGIC seed mixed with 10% of each cell's own profile
and 5% of the gene means, raised to the power 1.12 (valid under the likelihood rule; the calibration rule
scores it flattened to the MAGIC seed's sharpness).
Exits 1 unless the MAGIC seed beats no denoising (lower MSE and Poisson, positive score).

    .venv/bin/python benchmarks/denoising.py [--sandbox auto|process|docker] [--seeds 42 0 1]
        [--data PATH.h5ad --layer counts]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evaluators.bio.denoising.counts import OFFLINE_DEFAULT  # noqa: E402
from evaluators.bio.denoising.metrics import COUNT_POISSON_MIN, DROPOUT_AUC_MIN, LIKELIHOOD_SHARE  # noqa: E402
from evaluators.bio.denoising.problem import DenoisingProblem, program  # noqa: E402
from evaluators.bio.denoising.report import PUBLISHED  # noqa: E402
from evaluators.sandbox import sandbox_for  # noqa: E402

# The MAGIC seed's output sharpened: a lower published MSE, a lower count-scale likelihood (the
# likelihood rule rejects it, docs/method.md §5d).
MAGIC_SHARPENED = (
    program("magic")
    + """

_magic = magic_denoise


def magic_denoise(X, **kwargs):
    return _magic(X, **kwargs) ** 1.5
"""
)

# The MAGIC seed's per-cell profile mixed with the cell's own profile and the gene means, then sharpened: more
# count-scale likelihood than MAGIC, spent on sharpening (docs/method.md §5d calibration rule).
MAGIC_MIXED_SHARPENED = (
    program("magic")
    + """

_magic = magic_denoise


def magic_denoise(X, **kwargs):
    M = _magic(X, **kwargs)
    total = M.sum(axis=1, keepdims=True)
    own = X / np.maximum(X.sum(axis=1, keepdims=True), 1e-300)
    genes = X.mean(axis=0) / X.mean(axis=0).sum()
    return (0.85 * M / total + 0.1 * own + 0.05 * genes[None, :]) ** 1.12 * total
"""
)

METHODS = {
    "MAGIC seed (programs/magic.py)": program("magic"),
    "MAGIC (magic-impute, A, R)": program("magic_impute"),
    "ALRA (programs/alra.py, S, RN)": program("alra"),
    "MAGIC seed ^ 1.5 (sharpened)": MAGIC_SHARPENED,
    "MAGIC mixed, ^ 1.12 (sharpened)": MAGIC_MIXED_SHARPENED,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandbox", default="auto", choices=("auto", "process", "docker"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[42], help="split seeds (the released code's: 42)")
    parser.add_argument("--data", default=OFFLINE_DEFAULT, help="pbmc68k_reduced or a local .h5ad with raw counts")
    parser.add_argument("--layer", default="X", help="where the .h5ad keeps its counts: X, raw.X or a layer name")
    args = parser.parse_args()
    warnings.simplefilter("ignore", RuntimeWarning)  # the process backend's isolation warning: our own code runs here

    header = (
        f"{'seed':>4}  {'method':32} {'MSE':>8} {'Poisson':>8} {'norm MSE':>9} {'norm Pois':>9} {'score':>7} "
        f"{'count P':>8} {'/MAGIC':>7} {'AUC0':>6} {'q*':>6} {'cal MSE':>8} {'reward':>8} {'s':>6}  verdict"
    )
    magic_beats_none = True
    for seed in args.seeds:
        # our own programs only, so the process backend (which shows the data to a candidate) is allowed
        problem = DenoisingProblem(data=args.data, layer=args.layer, split_seed=seed)
        prepared = problem.prepared()
        box = sandbox_for(problem, args.sandbox)
        cells, genes = prepared.split.shape
        print(f"\n{prepared.source}: {cells} cells x {genes} genes, split seed {seed}, sandbox {box.name}")
        print(header)
        none = problem.score_output(prepared.split.train)
        rows = [("no denoising (D = train)", none, 0.0)]
        for name, code in METHODS.items():
            start = time.monotonic()
            rows.append((name, problem.evaluate(code, None, box), time.monotonic() - start))
        rows.append(("perfect (D = held-out counts)", problem.score_output(prepared.split.test), 0.0))
        for name, verdict, seconds in rows:
            m = verdict.metrics
            if not m:
                print(f"{seed:4d}  {name:32} failed: {verdict.reason}")
                continue
            status = "accepted" if verdict.valid else "rejected: " + verdict.reason.split(" (")[0]
            reward = "–" if name.startswith("perfect") else f"{verdict.reward:.4f}"  # 1 / 0: the reference, not a method
            print(
                f"{seed:4d}  {name:32} {m['mse']:8.4f} {m['poisson']:8.4f} {m['mse_normalized']:9.4f} "
                f"{m['poisson_normalized']:9.4f} {m['score']:7.4f} {m['count_poisson_normalized']:8.4f} "
                f"{m['count_poisson_normalized'] / prepared.baselines.count_poisson_magic:7.3f} "
                f"{m.get('dropout_auc', float('nan')):6.3f} {m['calibration_power']:6.3f} {m['mse_calibrated']:8.4f} {reward:>8} "
                f"{seconds:6.1f}  {status}"
            )
        seed_verdict = rows[1][1]
        magic_beats_none &= bool(
            seed_verdict.metrics
            and seed_verdict.metrics["mse"] < none.metrics["mse"]
            and seed_verdict.metrics["poisson"] < none.metrics["poisson"]
            and seed_verdict.metrics["score"] > 0
        )
        if hasattr(box, "close"):
            box.close()
    print(
        f"\ncount P, /MAGIC, AUC0: normalised count-scale Poisson, its share of the MAGIC seed's (run on the host), "
        f"and dropout AUC, our validity rules (>= {COUNT_POISSON_MIN}, >= {LIKELIHOOD_SHARE}, >= {DROPOUT_AUC_MIN}; "
        "docs/method.md §5d); q*, cal MSE: the power that maximises the count-scale likelihood and the MSE flattened "
        "to the MAGIC seed's q* where sharper, the calibration rule (reward 1 / max(MSE, cal MSE))."
    )
    print(f"Published on PBMC 1k (method paper, Table 7): {PUBLISHED}.")
    print("MAGIC seed beats no denoising on every split:", "yes" if magic_beats_none else "NO")
    return 0 if magic_beats_none else 1


if __name__ == "__main__":
    sys.exit(main())
