"""ALRA: adaptively-thresholded low-rank approximation (Linderman et al., Nat. Commun. 2022), a baseline.

Written from the paper's description, in the candidates' form `magic_denoise(X, **kwargs)`, wrapped
as OpenProblems' best ALRA variant ("sqrt norm, reversed normalisation"): square root of the counts,
then each cell divided by its total; ALRA; then squared and multiplied back by the totals.

ALRA on a normalised matrix A (cells x genes):
1. Rank k: the top 100 singular values by randomized SVD; k is the last place where the gap
   between consecutive singular values stands more than 6 standard deviations above the mean gap
   among the smallest 20 of those gaps (the noise).
2. A_k, the rank-k approximation of A by randomized SVD (10 power iterations).
3. Per gene, the magnitude of its most negative value in A_k is the noise level: values of A_k
   at or below it become 0 (true zeros stay zero).
4. Per gene, the non-zero values left are shifted and scaled to the mean and standard deviation
   of the gene's non-zero values in A; values that fall below 0 become 0.
5. An entry observed as non-zero in A but set to 0 by the steps above gets back its value in A.
"""

import numpy as np
from sklearn.utils.extmath import randomized_svd

K_SEARCH = 100  # singular values computed to choose the rank
NOISE_GAPS = 20  # the smallest gaps, taken as noise
GAP_SDS = 6.0  # a gap this many standard deviations above the noise marks the signal's end
POWER_ITERATIONS = 10


def choose_rank(A, random_state=None):
    """Step 1: the rank where the singular value spectrum's gaps stop standing out from the noise."""
    k_search = min(K_SEARCH, min(A.shape) - 1)
    _, s, _ = randomized_svd(A, k_search, n_iter=POWER_ITERATIONS, random_state=random_state)
    gaps = s[:-1] - s[1:]
    noise = gaps[-min(NOISE_GAPS, len(gaps)):]
    sd = noise.std(ddof=1) if len(noise) > 1 else 0.0
    if sd == 0:
        return 1
    standing_out = np.flatnonzero((gaps - noise.mean()) / sd > GAP_SDS)
    return int(standing_out[-1]) + 1 if len(standing_out) else 1


def alra(A, k=None, random_state=None):
    """Steps 2-5 on a non-negative normalised matrix A; k from `choose_rank` unless given."""
    A = np.asarray(A, dtype=np.float64)
    k = choose_rank(A, random_state) if k is None else k
    U, s, Vt = randomized_svd(A, k, n_iter=POWER_ITERATIONS, random_state=random_state)
    low_rank = (U * s) @ Vt

    noise_level = np.abs(np.minimum(low_rank.min(axis=0), 0.0))  # step 3
    out = np.where(low_rank > noise_level, low_rank, 0.0)

    kept, observed = out > 0, A > 0  # step 4
    n_kept, n_observed = kept.sum(axis=0), observed.sum(axis=0)
    mean_kept = np.where(kept, out, 0.0).sum(axis=0) / np.maximum(n_kept, 1)
    mean_observed = np.where(observed, A, 0.0).sum(axis=0) / np.maximum(n_observed, 1)
    sd_kept = np.sqrt(np.where(kept, (out - mean_kept) ** 2, 0.0).sum(axis=0) / np.maximum(n_kept - 1, 1))
    sd_observed = np.sqrt(np.where(observed, (A - mean_observed) ** 2, 0.0).sum(axis=0) / np.maximum(n_observed - 1, 1))
    scalable = (n_kept > 1) & (n_observed > 1) & (sd_kept > 0)
    scale = np.where(scalable, sd_observed / np.where(sd_kept > 0, sd_kept, 1.0), 1.0)
    shift = np.where(scalable, mean_observed - mean_kept * scale, 0.0)
    out = np.where(kept, out * scale + shift, 0.0)
    out[out < 0] = 0.0

    restore = observed & (out == 0)  # step 5
    out[restore] = A[restore]
    return out


def magic_denoise(X, random_state=None, **kwargs):
    X = np.asarray(X, dtype=np.float64)
    root = np.sqrt(X)
    libsize = root.sum(axis=1)
    libsize[libsize == 0] = 1.0
    denoised = alra(root / libsize[:, None], random_state=random_state)
    return np.square(denoised) * libsize[:, None]
