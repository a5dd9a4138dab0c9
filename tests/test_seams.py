"""The seams new work plugs into: the Problem contract, the one sandbox builder, pre-flight checks,
and `discover evaluate` with the problem's limits overridden."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cli.app import app
from discover.config import parse_config
from discover.preflight import PreflightError, preflight
from evaluators.base import BaseProblem
from evaluators.registry import get_problem, problem_names
from evaluators.sandbox import ProcessSandbox, sandbox_for
from evaluators.sandbox.base import SandboxLimits

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", problem_names())
def test_every_problem_keeps_the_whole_contract(name: str) -> None:
    p = get_problem(name)
    assert isinstance(p, BaseProblem) and p.name == name
    assert isinstance(p.image, str) and isinstance(p.needs_gpu, bool) and isinstance(p.limits, SandboxLimits)
    assert p.target is None or isinstance(p.target, float)
    assert len(p.archive_key("x = 1", None)) == 64
    assert isinstance(p.has_cases, bool) and isinstance(p.can_judge, bool) and isinstance(p.progress_logger, str)


def test_with_limits_changes_only_the_copy_and_the_description_follows() -> None:
    p = get_problem("erdos")
    q = p.with_limits(timeout_s=5, memory_mb=None)
    assert q.limits.timeout_s == 5 and q.limits.memory_mb == p.limits.memory_mb
    assert p.limits.timeout_s == 1100  # the original is untouched
    assert "5 s" in q.description and "1100 s" in p.description
    with pytest.raises(ValueError, match="unknown sandbox limits"):
        p.with_limits(walltime=3)


def test_archive_key_ignores_comments_and_whitespace_of_programs_only() -> None:
    p = BaseProblem()
    assert p.archive_key("x = 1  # first\ny = 2\n", None) == p.archive_key("x=1\n\ny = 2", None)
    assert p.archive_key("x = 1", None) != p.archive_key("x = 2", None)
    assert p.archive_key("", [1, 2]) == p.archive_key("other code", [1, 2])  # a construction decides
    assert p.archive_key("", [1, 2]) != p.archive_key("", [1, 3])
    cpp = BaseProblem()
    cpp.code_language = "cpp"
    assert cpp.archive_key("int a; // x\n/* y */ int b;", None) == cpp.archive_key("int a;int b;", None)


def test_one_builder_gives_each_problem_its_own_image() -> None:
    class CppProblem(BaseProblem):
        name, image = "cpp-example", "cpp20"

    assert sandbox_for(get_problem("toy"), "docker") is None  # no program to run
    assert isinstance(sandbox_for(CppProblem(), "process"), ProcessSandbox)
    from evaluators.sandbox import docker_unavailable

    why = docker_unavailable("cpp20")
    if why:
        with pytest.raises(ValueError, match="cannot run"):
            sandbox_for(CppProblem(), "docker")
    else:
        assert sandbox_for(CppProblem(), "docker").image == "discover/cpp20:latest"


def test_reevaluation_and_the_steps_build_their_sandbox_with_the_one_builder() -> None:
    for module in ("discover/steps.py", "discover/reevaluation.py", "cli/problems.py"):
        text = (REPO / module).read_text()
        assert "sandbox_for(" in text and "get_sandbox(" not in text, module


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model": {"name": "no such model!"}}, "neither a local model directory, a .gguf file nor a valid hub id"),
        ({"model": {"name": "./missing-dir"}}, "neither a local model directory"),
        ({"problem": "erdos", "problem_options": {"tolerance": 1}}, "problem_options"),
        ({"problem": "erdos", "problem_options": {"seeds_file": "/nonexistent/seeds.json"}}, "does not exist"),
    ],
)
def test_preflight_names_what_cannot_work(tmp_path: Path, change: dict, message: str) -> None:
    with pytest.raises(PreflightError, match=message):
        preflight(parse_config({"problem": "toy", "run_dir": str(tmp_path / "r"), **change}))


def test_a_hub_id_passes_preflight_without_any_download(tmp_path: Path) -> None:
    preflight(parse_config({"problem": "toy", "run_dir": str(tmp_path / "r"), "model": {"name": "Qwen/Qwen3-8B"}}))


def test_run_with_a_bad_model_fails_in_one_line_and_writes_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"problem": "toy", "run_dir": str(run_dir), "model": {"name": "/no/such/model"}}))
    proc = subprocess.run([sys.executable, "-m", "cli", "run", str(cfg)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "model.name" in proc.stderr and "Traceback" not in proc.stderr
    assert not run_dir.exists()
    # the corrected configuration is not refused as "another configuration" (nothing was left behind)


def test_evaluate_timeout_overrides_the_problem_limit(tmp_path: Path) -> None:
    spin = tmp_path / "spin.py"
    spin.write_text("def construct(parent):\n    while True:\n        pass\n")
    start = time.monotonic()
    result = CliRunner().invoke(app, ["evaluate", "erdos", str(spin), "--timeout", "5", "--json", "--sandbox", "process"])
    elapsed = time.monotonic() - start
    out = json.loads(result.output)
    assert result.exit_code == 1 and out["reward"] == 0 and "timeout after 5 s" in out["reason"]
    assert elapsed < 600  # bounded by the override, not the problem's 1100 s (no speed assumption)
