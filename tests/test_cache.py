"""The cache key of each step task covers exactly the files the task reads (flows/cache.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from discover import steps
from discover.config import parse_config
from discover.run import TASKS, Run, load_archive, save_archive
from flows.cache import step_cache_policy
from storage.manifest import read_manifest
from tests.conftest import tiny_toy_config


@pytest.fixture(scope="module")
def step0_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_cache: Path) -> Path:
    """A toy run initialised and taken through step 0, so every input of step 0's tasks exists."""
    config = parse_config(tiny_toy_config(tmp_path_factory.mktemp("cache") / "run", steps=1))
    run = steps.create_run(config)
    steps.initialise(run)
    for name in TASKS:
        getattr(steps, name)(run, 0)
    return run.root


@pytest.fixture
def run(step0_run: Path, tmp_path: Path) -> Run:
    """A fresh copy of that run for each test (tests edit its files)."""
    shutil.copytree(step0_run, tmp_path / "run")
    return Run.open(tmp_path / "run")


def _key(name: str, run: Run, step: int = 0) -> str:
    return step_cache_policy(name).compute_key(task_ctx=None, inputs={"run": run, "step": step}, flow_parameters={})


def _touch(path: Path) -> None:
    """Change a file (or a checkpoint folder) a task reads, without changing anything else."""
    if path.is_dir():
        (path / "adapter" / "adapter_config.json").write_text(
            json.dumps({**json.loads((path / "adapter" / "adapter_config.json").read_text()), "note": "edited"})
        )
    elif path.suffix == ".json":
        path.write_text(json.dumps({**json.loads(path.read_text()), "note": "edited"}))
    elif path.parent.name == "archive":
        archive = load_archive(path)
        next(iter(archive.states.values())).observation = "edited"
        save_archive(path, archive)
    else:
        path.write_bytes(path.read_bytes() + b"\0")  # a trailing byte: the content hash changes


@pytest.mark.parametrize("name", TASKS)
def test_changing_any_file_a_task_reads_changes_its_cache_key(run: Run, name: str) -> None:
    for input_name, path in run.reads(name, 0).items():
        before = _key(name, run)
        assert _key(name, run) == before  # deterministic
        _touch(path)
        assert _key(name, run) != before, f"{name}: editing its input {input_name} left the cache key unchanged"


def test_a_file_a_task_does_not_read_leaves_its_key_alone(run: Run) -> None:
    before = _key("select_parents", run)
    _touch(run.layout.rollouts(0))  # select_parents reads only the archive
    _touch(run.layout.checkpoint(0))
    assert _key("select_parents", run) == before


def test_keys_differ_by_task_step_and_run(run: Run, tmp_path: Path) -> None:
    keys = {_key(name, run) for name in TASKS}
    assert len(keys) == len(TASKS)
    assert _key("evaluate", run, step=0) != _key("evaluate", run, step=1)
    other = tmp_path / "copy"
    shutil.copytree(run.root, other)
    (other / "run.json").write_text(json.dumps({"run_id": "another", "created": 0}))
    assert _key("evaluate", Run.open(other)) != _key("evaluate", run)


@pytest.mark.slow
def test_a_task_whose_inputs_are_unchanged_is_not_run_again(run: Run, prefect_api: str) -> None:
    from prefect import flow

    from flows import tasks
    from flows.step_flow import result_storage

    @flow
    def select_once(run_dir: str) -> dict:
        opened = Run.open(run_dir)
        return tasks.select_parents.with_options(result_storage=result_storage(opened), result_serializer="json")(opened, 0)

    def executions() -> int:
        return sum(1 for e in read_manifest(run.layout.manifest)["executions"] if e["task"] == "select_parents")

    select_once(str(run.root))  # the steps above ran outside Prefect and recorded nothing
    assert executions() == 1
    select_once(str(run.root))  # a new flow run, same inputs: from the cache
    assert executions() == 1
    _touch(run.layout.archive(0))  # its input changed: it runs again
    select_once(str(run.root))
    assert executions() == 2


# -- the code a task runs is in its key (discover/code_version.py) -----------------------------

# The digest of the code a step runs (flows/cache.py `steps_code_digest`), in a fresh process of the
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


def test_the_step_source_key_is_the_digest_of_the_code_a_step_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from flows import cache

    key = cache.StepSource(name="generate").compute_key(task_ctx=None, inputs={}, flow_parameters={})
    monkeypatch.setattr(cache, "steps_code_digest", lambda: "other code")
    assert cache.StepSource(name="generate").compute_key(task_ctx=None, inputs={}, flow_parameters={}) != key


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
