"""A two-step denoising run on the tiny model: it completes, its archive holds the MAGIC seed with
the reward the sandbox gave it, and the report shows the best program against the baselines."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from unittest import mock

import pytest
import yaml

from evaluators.bio.denoising.problem import DenoisingProblem, program
from evaluators.bio.denoising.report import run_program
from tests.conftest import archive_records

pytestmark = pytest.mark.slow

_RUN = textwrap.dedent(
    """
    import sys
    from discover.config import dump_config, load_config
    from flows.run_flow import discovery_run

    cfg = load_config(sys.argv[1])
    result = discovery_run(run_dir=str(cfg.run_dir), config_yaml=dump_config(cfg))
    print(cfg.problem, result["best_state"], result["best_reward"], flush=True)
    """
)


@pytest.fixture(scope="module")
def long_context_tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with 8,192 positions: with its 512-token vocabulary the denoising context
    (problem text and the MAGIC program) is about 3,700 tokens, over the embedded model's 2,048."""
    from discover.policy import tiny_model

    out = tmp_path_factory.mktemp("models") / "tiny-gpt2-8k"
    with mock.patch.object(tiny_model, "N_POSITIONS", 8192):
        tiny_model.build_tiny_model(out)
    return out


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
    proc = subprocess.run([sys.executable, "-c", _RUN, str(path)], env=cli_env, capture_output=True, text=True, timeout=1200)
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

    report = write_report(run_dir).read_text()
    assert "## Denoising: the best program against the baselines" in report
    for method in ("MAGIC seed" if last[0]["id"] != seed["id"] else "best state seed-0", "no denoising", "ALRA", "perfect"):
        assert method in report
    assert f"{metrics['mse']:.4g}" in report  # the best program's MSE, as the sandbox measured it
