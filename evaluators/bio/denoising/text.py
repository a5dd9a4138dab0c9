"""The problem text the model sees (docs/method.md §5d, App. E), in our words; it states the live limits."""

from __future__ import annotations

from evaluators.bio.denoising.metrics import COUNT_POISSON_MIN, DROPOUT_AUC_MIN, LIKELIHOOD_SHARE, POISSON_ACCEPTED
from evaluators.sandbox.base import SandboxLimits


def describe(dataset: str, limits: SandboxLimits, random_state: int) -> str:
    low, high = POISSON_ACCEPTED
    return f"""\
Single-cell RNA-seq denoising (OpenProblems' denoising task, molecular cross-validation).

A single-cell experiment counts the mRNA molecules (UMIs) of each gene in each cell, but it
captures only a small fraction of them, so the counts are a noisy, sparse picture of each
cell's true expression. Denoising estimates the true expression from the counts.

The data: {dataset}.
Its observed molecules were split at random into a train part (each molecule kept with
probability 0.9) and a held-out test part (the rest). Your function sees only the train
counts X; its output D is compared with the held-out counts T:
- MSE: scale every row of T and of D to sum 10000, take log1p, average the squared
  differences over all entries (a row that sums to 0 stays 0). Lower is better.
- Poisson: D' = D * sum(T) / sum(X), then mean(T - D' * log(T + 1e-6)) over all entries
  (OpenProblems' published formula, which puts the test counts where the prediction would go:
  mass that D' puts on entries where T is 0 costs about 13.8 per unit). Lower is better.
- Each is normalised between "no denoising" (D = X, normalised value 0) and "perfect"
  (D = T, normalised value 1) on the same split; the benchmark's score is their mean.
Your output is rejected (reward 0) unless
- its normalised Poisson is in [{low:g}, {high:g}] (the published rule);
- on the count scale it predicts the held-out counts: with L = D * sum(T) / sum(D), the Poisson
  likelihood mean(L - T * log(L + 1e-6)), normalised the same way, is at least {COUNT_POISSON_MIN:g}
  (scaling D changes nothing here; the input X itself scores 0, a sharpened X below 0);
- that same normalised likelihood is at least {LIKELIHOOD_SHARE:g} times the one the initial MAGIC
  program reaches on the same split (raising an output to a power above 1, or keeping only its
  largest entries, lowers the MSE but makes it too sure of itself and fails this rule);
- among the entries where X is 0, it ranks those where T holds molecules above the others with an
  AUC of at least {DROPOUT_AUC_MIN:g} (a function of each entry's own count alone scores 0.5).
Then the reward is 1 / MSE, with the MSE taken no lower than that of your output flattened to the
initial MAGIC program's sharpness where it is sharper: q*, the power that maximises the count-scale
likelihood of D ** q, is found for D and for MAGIC, and D ** min(1, q*(D) / q*(MAGIC)) is scored too
(raising D beyond MAGIC's sharpness changes nothing in that figure; the reward is
1 / max(MSE of D, MSE of that)). It is also
rejected if it holds NaN or inf, a negative or subnormal value, a value above sum(X), is all zero,
or has another shape than X.

What is known to work: diffusion over a graph of similar cells (MAGIC) with the "reversed"
normalisation order (square root of the counts first, then divide each cell by its total, and
undo both at the end) keeps the normalised Poisson near 0.99; normalising first leaves it far
below 0.97. The square root stabilises the variance of counts. Small positive values where the
held-out count is 0 cost Poisson; low-rank structure across genes and smoothing in
log-normalised space can lower the MSE.

Your answer must contain one fenced ```python code block defining
    def magic_denoise(X, **kwargs):
        ...
        return denoised  # numpy array, same shape as X, non-negative
X is a float64 numpy array of train counts, cells x genes; it is called as
magic_denoise(X, random_state={random_state}). Only the last ```python block of your answer is used; put
every helper at the top level of that block. Available: numpy, scipy, scikit-learn, scanpy,
graphtools, scprep and magic (magic-impute); there is no network and no file to read.
Limits: {limits.timeout_s:g} s wall clock, {limits.memory_mb} MB of memory, {limits.cpus} CPU thread(s);
a run past them is killed and gets reward 0. Printed output is cut to its tail.
"""
