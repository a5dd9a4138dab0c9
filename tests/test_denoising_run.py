"""A two-step denoising run on the tiny model: it completes, its archive holds the MAGIC seed with
the reward the sandbox gave it, and the report shows the best program against the baselines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from evaluators.bio.denoising.problem import DenoisingProblem, program
from evaluators.bio.denoising.report import run_program
from tests.conftest import RUN_SCRIPT, archive_records

pytestmark = pytest.mark.slow


def test_two_steps_keep_the_magic_seed_with_its_reward(tmp_path: Path, long_context_tiny_model: Path, cli_env: dict[str, str]) -> None:
    run_dir = tmp_path / "denoising"
    config = {
        "problem": "denoising",
        "run_dir": str(run_dir),
        "steps": 2,
        "groups": 2,
        "rollouts_per_group": 2,
        "model": {"name": str(long_context_tiny_model), "lora_rank": 4, "device": "cpu"},
        "sampling": {"context_tokens": 8192, "thinking_budget": 8192, "max_answer_tokens": 8},
        "sandbox": {"backend": "process", "concurrency": 2},
    }
    path = tmp_path / "denoising.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run([sys.executable, "-c", RUN_SCRIPT, str(path)], env=cli_env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]

    first, _ = archive_records(run_dir / "archive" / "0000.parquet")
    last, _ = archive_records(run_dir / "archive" / "0002.parquet")
    assert len(first) == 1 and first[0]["is_seed"]
    seed = first[0]
    assert seed["code"] == program("magic")
    metrics = seed["construction"]
    assert seed["reward"] == pytest.approx(1.0 / metrics["mse"], rel=1e-15) and seed["reward"] > 0
    assert 0.97 <= metrics["poisson_normalized"] <= 1.0 and metrics["score"] > 0
    # the reward is the one this split gives the MAGIC program (computed here, outside any sandbox)
    problem = DenoisingProblem()
    expected = problem.score_output(run_program("magic", problem.prepared().split))
    assert seed["reward"] == pytest.approx(expected.reward, rel=1e-6)
    assert {r["id"]: r["reward"] for r in last if r["is_seed"]} == {seed["id"]: seed["reward"]}  # seeds stay
    assert all(r["reward"] > 0 for r in last)
    assert (run_dir / "steps" / "0001" / "evaluations.parquet").is_file()

    from discover.report import write_report
    from discover.run import Run

    report = write_report(Run.open(run_dir)).read_text()
    assert "## Denoising: the best program against the baselines" in report
    for method in ("MAGIC seed" if last[0]["id"] != seed["id"] else "best state seed-0", "no denoising", "ALRA", "perfect"):
        assert method in report
    assert f"{metrics['mse']:.4g}" in report  # the best program's MSE, as the sandbox measured it
