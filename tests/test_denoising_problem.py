"""The denoising Problem's contract (docs/method.md §5d): options and their errors, limits and the text that
states them, the seed, duplicates, data given to `verify`, the configuration with the paper's settings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from discover.config import load_config, parse_config
from discover.preflight import PreflightError, preflight
from discover.run import make_problem
from evaluators.bio.denoising.problem import PAPER_LIMITS, DenoisingProblem, program
from evaluators.registry import get_problem

REPO = Path(__file__).resolve().parents[1]


def test_defaults_are_the_papers_limits_and_the_offline_pbmc_counts() -> None:
    p = get_problem("denoising")
    assert isinstance(p, DenoisingProblem) and p.image == "bio" and p.needs_sandbox and not p.needs_gpu
    assert (p.limits.timeout_s, p.limits.memory_mb, p.limits.cpus) == (400.0, 3072, 1) == tuple(PAPER_LIMITS.values())
    assert "400 s" in p.description and "3072 MB" in p.description and "pbmc68k_reduced" in p.description
    q = p.with_limits(timeout_s=530)
    assert "530 s" in q.description and p.limits.timeout_s == 400
    assert q.prepared() is p.prepared()  # copies share one split


def test_the_configuration_carries_the_papers_settings() -> None:
    cfg = load_config(REPO / "configs" / "denoising.yaml")
    assert cfg.problem == "denoising" and cfg.steps == 50 and cfg.rollouts_per_step == 512
    assert cfg.sampling.thinking_budget == 20000 and cfg.train.kl_coef == 0.1 and cfg.sandbox.backend == "docker"
    p = make_problem(cfg)
    assert p.split_seed == 42 and p.limits.timeout_s == 400


@pytest.mark.parametrize(
    "options, message",
    [
        ({"data": "/no/such/counts.h5ad"}, "does not exist"),
        ({"data": "counts.csv"}, "an .h5ad file"),
        ({"layer": "counts"}, "not to the offline default"),
        ({"split_seed": "42"}, "split_seed must be an integer"),
        ({"tolerance": 1}, "problem_options"),
    ],
)
def test_bad_options_fail_before_the_run_starts(tmp_path: Path, options: dict, message: str) -> None:
    cfg = parse_config({"problem": "denoising", "run_dir": str(tmp_path / "r"), "problem_options": options})
    with pytest.raises(PreflightError, match=message):
        preflight(cfg)


def test_the_seed_is_the_magic_program_and_duplicates_are_judged_by_code() -> None:
    p = DenoisingProblem()
    seeds = p.seeds(np.random.default_rng(0), 8)
    assert [s.code for s in seeds] == [program("magic")]  # one initial state, not random
    assert p.parse("text\n```python\ndef magic_denoise(X, **k):\n    return X\n```\n") == "def magic_denoise(X, **k):\n    return X"
    a = p.archive_key("def f(X):  # one\n    return X\n", {"mse": 1.0})
    assert a == p.archive_key("def f(X):\n  return X", {"mse": 2.0})  # same code, other metrics: a duplicate
    assert a != p.archive_key("def f(X):\n  return X + 1", {"mse": 1.0})


def test_the_context_shows_the_states_metrics() -> None:
    metrics = {"mse": 3.1664, "poisson": 0.0923, "mse_normalized": 0.0705, "poisson_normalized": 0.991, "score": 0.5307}
    text = DenoisingProblem().render_state("def magic_denoise(X, **k):\n    return X", metrics)
    assert "MSE 3.166400" in text and "normalised Poisson 0.9910" in text and "score 0.5307" in text


def test_verify_scores_a_denoised_matrix_given_as_data() -> None:
    p = DenoisingProblem()
    split = p.prepared().split
    good = (0.02 * split.train + 0.98 * split.test).tolist()
    verdict = p.verify({"denoised": good})
    assert verdict.valid and verdict.metrics["poisson_normalized"] == pytest.approx(0.98, abs=1e-9)
    assert not p.verify(split.train.tolist()).valid  # no denoising: rejected by the Poisson range
    assert "list of rows" in p.verify({"mse": 0.1}).reason
    assert "rectangular" in p.verify([[1.0, 2.0], [3.0]]).reason


def test_the_report_section_sets_the_best_program_against_the_baselines() -> None:
    from types import SimpleNamespace

    p = DenoisingProblem()
    metrics = {"mse": 3.1664, "poisson": 0.0923, "mse_normalized": 0.0705, "poisson_normalized": 0.991, "score": 0.5307}
    best = SimpleNamespace(id="b", reward=1 / 3.1664, step=2, is_seed=False, code="", construction=metrics)
    seed = SimpleNamespace(id="s", reward=0.3, step=0, is_seed=True, code="", construction=dict(metrics, mse=3.3))
    [section] = p.report_sections([best, seed])
    assert section.title == "Denoising: the best program against the baselines"
    assert section.columns[:3] == ("method", "MSE", "Poisson")
    methods = [r["method"] for r in section.rows]
    assert methods[:2] == ["best state b (step 2)", "MAGIC seed s"] and any(m.startswith("ALRA") for m in methods)
    assert section.rows[0]["MSE"] == 3.1664 and "Published scores on PBMC 1k" in section.text
    assert p.summary_metrics(p.verify({"mse": 1.0})) == {}
    assert p.summary_metrics(type("R", (), {"metrics": metrics})()) == {"mse": 3.1664, "poisson": 0.0923, "score": 0.5307}
