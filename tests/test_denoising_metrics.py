"""The denoising protocol without a sandbox (docs/method.md §5d): the counts, the split, the metrics as
OpenProblems computed the published numbers, the normalisation, validity, acceptance and reward."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evaluators.bio.denoising.counts import filter_counts, load_counts, pbmc68k_counts
from evaluators.bio.denoising.metrics import Baselines, check_denoised, judge, measure, mse, poisson
from evaluators.bio.denoising.split import Split, keyed_seed, split_molecules


@pytest.fixture(scope="module")
def pbmc() -> np.ndarray:
    return load_counts().X


@pytest.fixture(scope="module")
def pbmc_split(pbmc: np.ndarray) -> Split:
    return split_molecules(pbmc, seed=42)


def test_pbmc_counts_are_recovered_as_integers_from_scanps_log_normalised_copy() -> None:
    import scanpy as sc

    counts, deviation = pbmc68k_counts()
    assert deviation < 0.1  # every recovered value lies within 0.1 of an integer (stored rounded)
    assert counts.shape == (700, 765) and counts.dtype == np.int64 and counts.min() == 0
    assert counts[counts > 0].min() == 1  # single molecules are seen as 1, not 0 or 2
    adata = sc.datasets.pbmc68k_reduced()
    totals = adata.obs["n_counts"].to_numpy(np.float64)
    again = np.log1p(counts / totals[:, None] * 1e4)  # the recovery inverts what raw.X stores
    np.testing.assert_allclose(again, adata.raw.X.toarray(), atol=2e-3)


def test_filters_drop_unseen_genes_then_cells_below_two_counts() -> None:
    X = np.array([[1, 0, 0, 3], [1, 0, 0, 0], [0, 0, 2, 0], [0, 0, 0, 0]])
    kept = filter_counts(X)
    assert kept.tolist() == [[1, 0, 3], [0, 2, 0]]  # gene 1 never seen; cells 1 and 3 below 2 counts


def test_split_preserves_totals_and_is_reproducible_from_its_seed(pbmc: np.ndarray) -> None:
    a, b, c = split_molecules(pbmc, 42), split_molecules(pbmc, 42), split_molecules(pbmc, 7)
    kept = pbmc.sum(axis=0) > 0
    np.testing.assert_array_equal(a.train + a.test, pbmc[:, kept])  # train + test = counts
    assert a.train.min() >= 0 and a.test.min() >= 0
    np.testing.assert_array_equal(a.train, b.train)
    np.testing.assert_array_equal(a.test, b.test)
    assert not np.array_equal(a.train, c.train)
    assert abs(a.train.sum() / pbmc.sum() - 0.9) < 0.01
    # OpenProblems' generator and call, numpy.random.RandomState(seed).binomial(X, 0.9), keyed=False;
    # the problem's split is keyed with the counts, so the configured seed does not give it away
    published = split_molecules(pbmc, 42, keyed=False)
    np.testing.assert_array_equal(published.train, np.random.RandomState(42).binomial(pbmc, 0.9)[:, kept])
    assert not np.array_equal(a.train, published.train)
    np.testing.assert_array_equal(a.train, np.random.RandomState(keyed_seed(pbmc, 42)).binomial(pbmc, 0.9)[:, kept])


def test_split_drops_genes_without_train_molecules() -> None:
    X = np.array([[0, 5, 1], [0, 7, 0], [1, 0, 0]])
    seed = next(s for s in range(1000) if np.random.RandomState(s).binomial(X, 0.9)[:, [0, 2]].sum(axis=0).min() == 0)
    split = split_molecules(X, seed, keyed=False)
    train = np.random.RandomState(seed).binomial(X, 0.9)
    assert split.shape[1] == int((train.sum(axis=0) > 0).sum()) < 3
    assert split.train.sum(axis=0).min() > 0


def test_small_example_by_hand() -> None:
    train = np.array([[2.0, 2.0], [4.0, 1.0]])  # total 9
    test = np.array([[1.0, 1.0], [2.0, 0.0]])  # total 4
    D = np.array([[1.0, 3.0], [1.0, 1.0]])
    # MSE: rows scaled to 1e4, log1p. test -> [5000, 5000], [10000, 0]; D -> [2500, 7500], [5000, 5000]
    L = math.log
    expected_mse = ((L(5001) - L(2501)) ** 2 + (L(5001) - L(7501)) ** 2 + (L(10001) - L(5001)) ** 2 + L(5001) ** 2) / 4
    assert mse(test, D) == pytest.approx(expected_mse, rel=1e-12)
    # Poisson as published: D' = D * 4/9, mean(T - D' ln(T + 1e-6))
    s = 4 / 9
    expected_poisson = ((1 - s * 1 * L(1 + 1e-6)) + (1 - s * 3 * L(1 + 1e-6)) + (2 - s * 1 * L(2 + 1e-6)) + (0 - s * 1 * L(1e-6))) / 4
    assert poisson(train.sum(), test, D) == pytest.approx(expected_poisson, rel=1e-12)
    assert expected_poisson == pytest.approx(2.4580, abs=1e-4)  # the 0-count entry alone adds 13.8 x 4/9 / 4


def test_poisson_is_molecular_cross_validations_loss_with_its_arguments_swapped(pbmc_split: Split) -> None:
    def poisson_nll_loss(y_pred: np.ndarray, y_true: np.ndarray) -> float:  # molecular_cross_validation.mcv_sweep
        return float((y_pred - y_true * np.log(y_pred + 1e-6)).mean())

    s = pbmc_split
    D = s.train * 0.7 + 0.1
    scaled = D * s.test.sum() / s.train.sum()
    assert poisson(s.train_total, s.test, D) == pytest.approx(poisson_nll_loss(s.test, scaled), rel=1e-12)  # as OpenProblems calls it
    assert poisson(s.train_total, s.test, D) != pytest.approx(poisson_nll_loss(scaled, s.test), rel=1e-3)  # not the textbook order


def test_mse_is_scanpys_normalize_total_log1p_then_sklearns_mse(pbmc_split: Split) -> None:
    import anndata
    import scanpy as sc
    import sklearn.metrics

    s = pbmc_split
    D = np.sqrt(s.train) * 3.0
    D[5] = 0.0  # a row that sums to 0 stays 0 in scanpy
    test_data, denoised_data = anndata.AnnData(X=s.test.copy()), anndata.AnnData(X=D.copy())
    for data in (test_data, denoised_data):
        sc.pp.normalize_total(data, target_sum=10000)
        sc.pp.log1p(data)
    expected = sklearn.metrics.mean_squared_error(test_data.X, denoised_data.X)
    assert mse(s.test, D) == pytest.approx(expected, rel=1e-12)


def test_no_denoising_scores_0_and_perfect_scores_1_on_each_normalised_metric(pbmc_split: Split) -> None:
    b = Baselines.of(pbmc_split)
    none = measure(pbmc_split, b, pbmc_split.train)
    perfect = measure(pbmc_split, b, pbmc_split.test)
    for key in ("mse_normalized", "poisson_normalized", "score"):
        assert none[key] == pytest.approx(0.0, abs=1e-12)
        assert perfect[key] == pytest.approx(1.0, abs=1e-12)
    assert b.mse_perfect == 0.0 and b.mse_none > 0 and b.poisson_none > b.poisson_perfect


def test_baselines_are_those_of_the_split_being_scored(pbmc: np.ndarray) -> None:
    a, c = split_molecules(pbmc, 42), split_molecules(pbmc, 7)
    assert Baselines.of(a) != Baselines.of(c)
    # each split's own "no denoising" is its zero: normalising by another split's would not give 0
    assert measure(c, Baselines.of(c), c.train)["mse_normalized"] == pytest.approx(0.0, abs=1e-12)


def test_reward_is_one_over_mse_when_the_normalised_poisson_is_in_range(pbmc_split: Split) -> None:
    s, b = pbmc_split, Baselines.of(pbmc_split)
    # Poisson is affine in D: 2% of no denoising (D = train) and 98% of perfect (D = test) give 0.98
    D = 0.02 * s.train + 0.98 * s.test
    verdict = judge(s, b, D)
    assert verdict.valid and verdict.metrics["poisson_normalized"] == pytest.approx(0.98, abs=1e-9)
    assert verdict.reward == pytest.approx(1.0 / verdict.metrics["mse"], rel=1e-15)
    assert verdict.metrics["score"] == pytest.approx((verdict.metrics["mse_normalized"] + verdict.metrics["poisson_normalized"]) / 2)
    rejected = judge(s, b, s.train)  # no denoising: normalised Poisson 0
    assert not rejected.valid and rejected.reward == 0.0 and "outside [0.97, 1" in rejected.reason
    above = judge(s, b, s.test**2)  # mass piled on the largest held-out counts: normalised Poisson > 1
    assert above.metrics["poisson_normalized"] > 1.0 and not above.valid and above.reward == 0.0


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda X: np.where(np.arange(X.size).reshape(X.shape) == 3, np.nan, X), "non-finite"),
        (lambda X: np.where(np.arange(X.size).reshape(X.shape) == 3, np.inf, X), "non-finite"),
        (lambda X: X - 1.0, "negative"),
        (lambda X: X[:, :-1], "expected"),
        (lambda X: X.T, "expected"),
        (lambda X: X.ravel(), "expected"),
        (lambda X: np.where(np.arange(X.size).reshape(X.shape) == 0, X.sum() * 2, X), "above the train matrix's total"),
        (lambda X: X.astype(complex), "not real numbers"),
        (lambda X: X.tolist(), "not an array"),
    ],
    ids=["nan", "inf", "negative", "fewer genes", "transposed", "flat", "too large", "complex", "list"],
)
def test_each_invalid_output_gets_reward_0_with_its_reason(pbmc_split: Split, make, reason: str) -> None:
    verdict = judge(pbmc_split, Baselines.of(pbmc_split), make(pbmc_split.train))
    assert not verdict.valid and verdict.reward == 0.0 and reason in verdict.reason


def test_a_value_equal_to_the_train_total_is_allowed(pbmc_split: Split) -> None:
    Y = pbmc_split.train.copy()
    Y[0, 0] = pbmc_split.train_total
    assert check_denoised(Y, pbmc_split)[0] is not None


def test_h5ad_counts_from_a_chosen_layer_and_cell_selection(tmp_path) -> None:
    import anndata
    import pandas as pd

    rng = np.random.default_rng(0)
    counts = rng.poisson(1.0, size=(30, 12)).astype(np.float32)
    counts[:, 4] = 0  # a gene never seen
    adata = anndata.AnnData(
        X=np.log1p(counts), obs=pd.DataFrame({"tech": ["inDrop1"] * 20 + ["celseq"] * 10}, index=[f"c{i}" for i in range(30)])
    )
    adata.layers["counts"] = counts
    path = tmp_path / "toy.h5ad"
    adata.write_h5ad(path)
    loaded = load_counts(str(path), layer="counts", keep_obs={"tech": ["inDrop1"]})
    expected = filter_counts(counts[:20].astype(np.int64))
    np.testing.assert_array_equal(loaded.X, expected)
    assert loaded.shape[1] == 11
    with pytest.raises(ValueError, match="integer counts"):
        load_counts(str(path))  # X holds log-normalised values
    with pytest.raises(ValueError, match="no layer 'raw_counts'"):
        load_counts(str(path), layer="raw_counts")
    with pytest.raises(ValueError, match="no obs column"):
        load_counts(str(path), layer="counts", keep_obs={"batch": ["a"]})
    with pytest.raises(ValueError, match="does not exist"):
        load_counts(str(tmp_path / "missing.h5ad"))
