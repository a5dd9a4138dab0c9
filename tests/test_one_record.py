"""One record of what is finished (discover/run.py, docs/runs.md "One record of what is finished").

The manifest alone decides whether a task runs: Prefect caches nothing of the step tasks, so a task
whose output exists but is not recorded runs again, and one recorded never does. Each step task is
declared once (`StepTask` in discover/run.py, bound to its function by `steps.runs`), and the
project's code uses Prefect's public API only.
"""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

from discover import steps
from discover.config import parse_config
from discover.run import STEP_TASKS, TASKS
from storage.manifest import read_manifest
from tests.conftest import tiny_toy_config

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("cli", "flows", "discover", "evaluators", "storage")


def _sources(packages: tuple[str, ...] = PACKAGES) -> dict[str, ast.Module]:
    return {str(p.relative_to(REPO)): ast.parse(p.read_text()) for pkg in packages for p in (REPO / pkg).rglob("*.py")}


def test_a_task_runs_exactly_when_the_manifest_does_not_record_it(tmp_path: Path, tiny_model_cache: Path, prefect_api: str) -> None:
    from flows.step_flow import discovery_step

    run = steps.create_run(parse_config(tiny_toy_config(tmp_path / "run", steps=1)))
    steps.initialise(run)

    def executions() -> list[str]:
        return [e["task"] for e in read_manifest(run.layout.manifest)["executions"]]

    discovery_step(str(run.root), 0)
    assert executions() == list(TASKS)
    discovery_step(str(run.root), 0)  # a new flow run: everything recorded, nothing runs
    assert executions() == list(TASKS)
    # train's output is on disk but the manifest forgets it (a kill between writing and recording):
    # it runs again, inputs unchanged; no other record (a cache) claims it finished
    manifest = read_manifest(run.layout.manifest)
    del manifest["tasks"]["0/train"]
    run.layout.manifest.write_text(json.dumps(manifest))
    discovery_step(str(run.root), 0)
    assert executions() == [*TASKS, "train"]
    assert not (run.root / "prefect-results").exists()


def test_each_step_task_is_declared_once_and_bound_to_one_function() -> None:
    assert [t.name for t in STEP_TASKS] == list(TASKS)
    assert set(steps.STEP_FUNCTIONS) == set(TASKS)  # every declaration has its function, and no function lacks one
    # Where a task's name is spelled in the project's code: only in its declaration.
    spelled: dict[str, list[str]] = {name: [] for name in TASKS}
    for path, tree in _sources().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in spelled:
                spelled[node.value].append(f"{path}:{node.lineno}")
    for name, places in spelled.items():
        if name in ("generate", "evaluate", "train"):  # common words: also config keys and thread names elsewhere
            places = [p for p in places if p.startswith(("discover/run.py", "discover/steps.py", "flows/"))]
        assert len(places) == 1 and places[0].startswith("discover/run.py"), (name, places)
    # No name-based dispatch to the step functions (getattr on discover.steps).
    for path, tree in _sources().items():
        for n in ast.walk(tree):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "getattr" and n.args:
                assert not (isinstance(n.args[0], ast.Name) and n.args[0].id == "steps"), f"{path}:{n.lineno}"


def test_the_code_uses_prefects_public_api_only() -> None:
    """No import of a private Prefect module or name, and no private attribute of a Prefect object
    (the lock can move to a new Prefect release without reading its internals)."""
    found = []
    for path, tree in _sources((*PACKAGES, "benchmarks")).items():
        prefect_names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0].startswith("prefect"):
                parts = (node.module or "").split(".")
                for alias in node.names:
                    prefect_names.add(alias.asname or alias.name)
                    if any(p.startswith("_") for p in [*parts, alias.name]):
                        found.append(f"{path}:{node.lineno} from {node.module} import {alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0].startswith("prefect"):
                        prefect_names.add((alias.asname or alias.name).split(".")[0])
                        if any(p.startswith("_") for p in alias.name.split(".")):
                            found.append(f"{path}:{node.lineno} import {alias.name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "getattr"):
                if len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and str(node.args[1].value).startswith("_is_"):
                    found.append(f"{path}:{node.lineno} {node.func.id}(..., {node.args[1].value!r})")
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                base = node.value
                while isinstance(base, ast.Attribute):
                    base = base.value
                if isinstance(base, ast.Name) and base.id in prefect_names:
                    found.append(f"{path}:{node.lineno} {base.id}...{node.attr}")
    assert found == [], found


# -- the code a step runs, as discover/code_version.py finds it ------------------------------------

# The digest of the code a step runs (what the evaluation's and the replicas' specification hashes are made of), in a fresh process of the
# copied tree: discover/code_version.py reads sources without importing them, so this is quick.
_KEY_SCRIPT = """
import sys
from discover import code_version
assert code_version.__file__.startswith(sys.argv[1]), code_version.__file__
print(code_version.source_digest(code_version.module_closure("discover.steps")))
"""


def test_the_step_closure_holds_the_helpers_a_step_calls_and_nothing_outside() -> None:
    from discover.code_version import module_closure

    closure = set(module_closure("discover.steps"))
    # direct and indirect imports, an import inside a function, a problem named in the registry
    for name in (
        "discover.steps",
        "discover.prompts",
        "discover.reuse",
        "evaluators.parsing",
        "discover.policy.transformers_backend",
        "evaluators.toy.digits",
        "storage.atomic",
    ):
        assert name in closure, name
    assert not {m for m in closure if m.split(".")[0] in ("cli", "flows", "tests")}


def test_an_edit_in_a_helper_a_step_calls_changes_the_key(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    for package in ("cli", "discover", "evaluators", "flows", "storage"):
        shutil.copytree(repo / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))

    def key() -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update(PYTHONPATH=str(tmp_path), PREFECT_HOME=str(tmp_path / "prefect-home"))
        proc = subprocess.run(
            [sys.executable, "-c", _KEY_SCRIPT, str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout.strip().splitlines()[-1]

    def edit(relative: str) -> None:
        path = tmp_path / relative
        path.write_text(path.read_text() + "\n# edited\n")

    before = key()
    assert key() == before  # an unchanged tree, the same key
    edit("cli/app.py")  # outside what a step runs
    assert key() == before
    edit("evaluators/parsing.py")  # reached from discover/steps.py only through other modules
    after = key()
    assert after != before
    edit("discover/reuse.py")  # imported by discover/steps.py itself
    assert key() not in (before, after)
