"""A two-step discovery run of each mathematics problem on the tiny model: the run completes and
its archive holds the seeds with the rewards their verifiers give."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from evaluators.registry import get_problem
from tests.conftest import archive_records as read_archive

pytestmark = pytest.mark.slow

PROBLEMS = ["erdos", "ac1", "ac2", "circles-26", "circles-32"]

# One Python process runs the five flows one after the other (a process per run would pay the
# imports of torch, transformers and Prefect five times).
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


def _config(tmp_path: Path, problem: str, **extra) -> dict:
    return {
        "problem": problem,
        "run_dir": str(tmp_path / problem),
        "steps": 2,
        "groups": 2,
        "rollouts_per_group": 2,
        "model": {"name": "tiny", "lora_rank": 4, "device": "cpu"},
        # the math prompts take up to ~1,900 tokens of the tiny model's 2,048
        "sampling": {"context_tokens": 2048, "thinking_budget": 2048, "max_answer_tokens": 8},
        "sandbox": {"backend": "process", "timeout_s": 300, "concurrency": 2},
        **extra,
    }


def test_two_steps_of_each_math_problem_keep_the_seeds_with_their_rewards(tmp_path: Path, cli_env: dict[str, str]) -> None:
    seeds_file = tmp_path / "ac2-seeds.json"  # a run that starts from given constructions
    seeds_file.write_text(json.dumps([[0.5] * 1200, {"values": [1.0, 0.25] * 700}]))
    configs = {p: _config(tmp_path, p) for p in PROBLEMS}
    configs["erdos"]["reuse"] = {"seed_states": 3}
    configs["ac2"]["problem_options"] = {"seeds_file": str(seeds_file)}
    paths = []
    for problem, config in configs.items():
        paths.append(tmp_path / f"{problem}.yaml")
        paths[-1].write_text(yaml.safe_dump(config))

    proc = subprocess.run([sys.executable, "-c", _RUN_ALL, *map(str, paths)], env=cli_env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [line.split()[0] for line in proc.stdout.splitlines()] == PROBLEMS

    # erdos: seed_states 3; ac2: the file's two; the others one per group (docs/method.md §5a), 2 groups
    expected_seeds = {"erdos": 3, "ac1": 2, "ac2": 2, "circles-26": 2, "circles-32": 2}
    for problem in PROBLEMS:
        run_dir = tmp_path / problem
        verifier = get_problem(problem, **configs[problem].get("problem_options", {}))
        first, _ = read_archive(run_dir / "archive" / "0000.parquet")
        last, _ = read_archive(run_dir / "archive" / "0002.parquet")
        seeds = [r for r in first if r["is_seed"]]
        assert len(seeds) == len(first) == expected_seeds[problem]
        for seed in seeds:
            verdict = verifier.verify(seed["construction"])
            assert verdict.valid and seed["reward"] == verdict.reward > 0
        kept = {r["id"]: r["reward"] for r in last if r["is_seed"]}
        assert kept == {s["id"]: s["reward"] for s in seeds}  # seeds are always kept (docs/method.md §3)
        assert all(r["reward"] > 0 for r in last)  # only valid states enter the archive
        evaluations = run_dir / "steps" / "0001" / "evaluations.parquet"
        assert evaluations.is_file()

    ac2_seeds = [r["construction"] for r in read_archive(tmp_path / "ac2" / "archive" / "0000.parquet")[0]]
    assert ac2_seeds == [[0.5] * 1200, [1.0, 0.25] * 700]
