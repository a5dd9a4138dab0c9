"""A two-step discovery run of each AtCoder problem on the tiny model (issue 8, Must show 5): the run
completes, its archive holds the seeds with the rewards the judge gives them, and the run's report
shows the best program's per-case scores."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from discover.report import write_report
from discover.run import Run
from evaluators.algorithms.ahc039 import judge as judge039
from evaluators.algorithms.cases import public_inputs
from tests.conftest import archive_records as read_archive

pytestmark = pytest.mark.slow

CASES = "0-4"
RECTANGLE = "4\n20000 20000\n80000 20000\n80000 80000\n20000 80000\n"
# A short valid start, so that the prompt fits the tiny model's 2,048 positions.
SEED_PROGRAM = '#include <cstdio>\nint main() { printf("%s"); }\n' % RECTANGLE.replace("\n", "\\n")

_RUN_ALL = textwrap.dedent(
    """
    import sys
    from discover.config import load_config
    from flows.run_flow import discovery_run

    for path in sys.argv[1:]:
        cfg = load_config(path)
        result = discovery_run(config=cfg)
        print(cfg.problem, result["best_state"], result["best_reward"], flush=True)
    """
)


def _config(tmp_path: Path, problem: str, options: dict) -> dict:
    return {
        "problem": problem,
        "run_dir": str(tmp_path / problem),
        "steps": 2,
        "groups": 2,
        "rollouts_per_group": 2,
        "model": {"name": "tiny", "lora_rank": 4, "device": "cpu"},
        "train": {"kl_coef": 0.01},
        "sampling": {"context_tokens": 2048, "thinking_budget": 2048, "max_answer_tokens": 8},
        "sandbox": {"backend": "process", "concurrency": 2},
        "problem_options": {"cases": CASES, **options},
    }


def test_two_steps_of_each_atcoder_problem_keep_the_seeds(tmp_path: Path, cli_env: dict[str, str]) -> None:
    seed_file = tmp_path / "start.cpp"
    seed_file.write_text(SEED_PROGRAM)
    configs = {
        "ahc039": _config(tmp_path, "ahc039", {"initial_program": str(seed_file)}),
        "ahc058": _config(tmp_path, "ahc058", {}),
    }
    paths = []
    for problem, config in configs.items():
        paths.append(tmp_path / f"{problem}.yaml")
        paths[-1].write_text(yaml.safe_dump(config))
    proc = subprocess.run([sys.executable, "-c", _RUN_ALL, *map(str, paths)], env=cli_env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [line.split()[0] for line in proc.stdout.splitlines()] == list(configs)

    expected = sum(judge039(public_inputs("ahc039")[c], RECTANGLE).score for c in range(5)) / 5 / 1500
    seeds = {}
    for problem in configs:
        first, _ = read_archive(tmp_path / problem / "archive" / "0000.parquet")
        last, _ = read_archive(tmp_path / problem / "archive" / "0002.parquet")
        # one seed state per group (docs/method.md §5a): 2 copies of the initial program, scored by one judging
        assert len(first) == 2 and all(r["is_seed"] for r in first)
        assert first[0]["code"] == first[1]["code"] and first[0]["reward"] == first[1]["reward"]
        seeds[problem] = first[0]
        assert {r["id"]: r["reward"] for r in last if r["is_seed"]} == {r["id"]: r["reward"] for r in first}
        assert (tmp_path / problem / "steps" / "0001" / "evaluations.parquet").is_file()
    assert seeds["ahc039"]["code"] == SEED_PROGRAM and seeds["ahc039"]["reward"] == pytest.approx(expected)
    assert [row[:2] for row in seeds["ahc039"]["construction"]["cases"]] == [[c, "AC"] for c in range(5)]
    assert seeds["ahc058"]["code"] == "" and seeds["ahc058"]["reward"] == 0.0

    report = write_report(Run.open(tmp_path / "ahc039")).read_text()
    assert "## Per-case results of the best program" in report
    for c in range(5):
        score = judge039(public_inputs("ahc039")[c], RECTANGLE).score
        assert f"| {c} | AC | {score} |" in report
