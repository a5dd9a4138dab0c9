"""Runs written by an older version stay usable, and the code computes what the old one did. The
fixtures in tests/fixtures/v1-runs/ were written by the code of commit 3980862, the last version
before records carried a schema version (tests/fixtures/make_v1_runs.py says how), on one
machine: `complete/` is a whole 3-step toy run, `killed/` the same configuration SIGKILLed at the
start of step 1's train task.

What is compared holds on any CPU: exact equality where the arithmetic is exact or seeded (parents,
verdicts, archives, prompt tokens), float tolerances where a CPU's own kernels decide the last bits
(log-probabilities, adapters, training statistics), and never the tokens a fresh sampling draws."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from discover import steps
from discover.records import Evaluation, State
from discover.run import TASKS, Run, load_archive, read_evaluations, read_rollouts
from storage.atomic import content_hash
from storage.manifest import read_manifest
from storage.tables import SchemaError, read_records, write_records

pytestmark = pytest.mark.slow

V1 = Path(__file__).parent / "fixtures" / "v1-runs"
STEPS = 3
# What a verdict is, without the time it took (which differs between any two runs).
VERDICT = ("child_id", "parent_id", "group", "index", "reward", "valid", "reason", "code", "construction", "metrics", "observation")


def _discover(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def _verdicts(path: Path) -> list[tuple]:
    return [tuple(getattr(e, f) for f in VERDICT) for e in read_evaluations(path)]


def assert_adapters_close(ours: Path, theirs: Path) -> None:
    """The same LoRA tensors within float rounding: another CPU sums the gradients in another order
    (its SIMD kernels), so the last bits differ; Adam then moves each weight by about the learning
    rate, whatever the gradient's size, so a weight whose gradient is near zero may move the other
    way. Each tensor must agree to 1e-3 of its norm: a changed objective, advantage or learning
    rate moves the adapter by far more (the lr alone is 10% of a LoRA weight here)."""
    a = load_file(ours / "adapter" / "adapter_model.safetensors")
    b = load_file(theirs / "adapter" / "adapter_model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert float((a[k] - b[k]).norm()) <= 1e-3 * float(b[k].norm()) + 1e-8, f"{k} differs from v1's"


def test_records_written_by_v1_read_with_the_new_fields_at_their_defaults() -> None:
    evaluations = read_evaluations(V1 / "complete" / "steps" / "0000" / "evaluations.parquet")
    assert evaluations and all(isinstance(e, Evaluation) for e in evaluations)
    assert any(e.valid for e in evaluations) and all(e.reward == 0.0 for e in evaluations if not e.valid)
    # version 1 called the candidate's output `logs`; it is read into `observation`
    archive = load_archive(V1 / "complete" / "archive" / "0003.parquet")
    assert all(isinstance(s, State) for s in archive.states.values()) and archive.total_expansions == 6


def test_a_missing_column_takes_its_default_and_a_newer_file_is_refused(tmp_path: Path) -> None:
    @dataclasses.dataclass
    class Old:
        id: str

    @dataclasses.dataclass
    class New:
        SCHEMA_VERSION = 2
        id: str
        score: float = 0.5
        tags: list[str] = dataclasses.field(default_factory=list)

    write_records(tmp_path / "old.parquet", [Old("a"), Old("b")], Old)
    records, meta = read_records(tmp_path / "old.parquet", New)
    assert records == [New("a"), New("b")] and meta["schema_version"] == "1"

    write_records(tmp_path / "new.parquet", [New("a", 1.0)], New)
    with pytest.raises(SchemaError, match="newer"):
        read_records(tmp_path / "new.parquet", Old)

    @dataclasses.dataclass
    class Required:
        id: str
        score: float  # no default: an old file without it cannot be read

    with pytest.raises(SchemaError, match="score"):
        read_records(tmp_path / "old.parquet", Required)


def test_a_run_killed_under_v1_resumes_without_running_a_finished_task_again(tmp_path: Path, cli_env: dict[str, str]) -> None:
    """`killed/` was written by v1 and SIGKILLed at the start of step 1's train; the resume, by this
    code, runs only step 1's train and step 2, and leaves every output v1 recorded as it was. The
    train of step 1 learns from v1's rollouts and verdicts, so it agrees with v1's own within float
    rounding (`assert_adapters_close`); step 2 samples new rollouts, which another CPU may draw
    differently, so of step 2 only that it finished is checked."""
    run = tmp_path / "killed"
    shutil.copytree(V1 / "killed", run)
    manifest = read_manifest(run / "manifest.json")
    before = [(e["step"], e["task"]) for e in manifest["executions"]]
    assert (1, "train") not in before and (1, "update_archive") in before  # killed at the start of step 1's train
    recorded = {key: (entry["output"]["path"], content_hash(run / entry["output"]["path"])) for key, entry in manifest["tasks"].items()}

    resumed = _discover(["resume", str(run)], tmp_path, cli_env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    manifest = read_manifest(run / "manifest.json")
    executions = [(e["step"], e["task"]) for e in manifest["executions"]]
    assert executions == before + [(1, "train")] + [(2, t) for t in TASKS], executions
    assert all(f"{step}/{t}" in manifest["tasks"] for step in range(STEPS) for t in TASKS)
    assert {key: (path, content_hash(run / path)) for key, (path, _) in recorded.items()} == recorded
    assert_adapters_close(run / "checkpoints" / "0002", V1 / "complete" / "checkpoints" / "0002")
    status = _discover(["status", str(run)], tmp_path, cli_env)
    assert status.returncode == 0 and f"{STEPS}/{STEPS} steps started" in status.stdout, status.stdout + status.stderr


@pytest.fixture
def v1_run(tmp_path: Path, tiny_model_cache: Path) -> Run:
    """A copy of v1's complete run, opened by this code (its config.yaml, written by v1 with every
    default, loads)."""
    shutil.copytree(V1 / "complete", tmp_path / "run")
    return Run.open(tmp_path / "run")


@pytest.mark.parametrize("step", range(STEPS))
def test_each_task_computes_from_v1s_inputs_what_v1_computed(v1_run: Run, step: int) -> None:
    """Each task of each step, run by this code on the files v1 gave it, writes what v1 wrote:
    the same parents, verdicts and archive exactly (integer and seeded arithmetic, the same on every
    CPU), and the same adapter and training statistics within float rounding. Generation draws
    tokens from the model's probabilities, and another CPU computes those in another order, so a
    token close to a boundary may come out differently there: instead of v1's tokens, the test
    checks what decides them, i.e. that this code builds the same prompt tokens and gives v1's
    sampled tokens the log-probabilities v1 sampled them with."""
    from discover.policy import load_policy

    run, theirs = v1_run, Run.open(V1 / "complete")
    L = run.layout

    L.parents(step).unlink()
    steps.select_parents(run, step)
    assert json.loads(L.parents(step).read_text()) == json.loads(theirs.layout.parents(step).read_text())

    rollouts = read_rollouts(theirs.layout.rollouts(step))
    policy = load_policy(run.config.model, L.checkpoint(step) / "adapter")
    temperature = run.config.sampling.temperature
    ours = policy.sequence_logprobs([r.completion() for r in rollouts], temperature=temperature)
    for r, lp in zip(rollouts, ours):
        sampled = [x for x, m in zip(r.sampler_logprobs, r.loss_mask) if m]
        rescored = [float(x) for x, m in zip(lp.tolist(), r.loss_mask) if m]
        assert rescored == pytest.approx(sampled, abs=1e-4), f"rollout {r.group}/{r.index} of step {step}"
    contexts = [g["context"] for g in json.loads(L.parents(step).read_text())["groups"]]
    one = run.config.sampling.model_copy(update={"max_answer_tokens": 1})
    fresh = policy.sample(contexts, 1, one, seed=0)
    assert [g[0].prompt_ids for g in fresh] == [next(r.prompt_ids for r in rollouts if r.group == g) for g in range(len(contexts))]

    shutil.rmtree(L.candidates(step), ignore_errors=True)
    L.evaluations(step).unlink()
    steps.evaluate(run, step)
    assert _verdicts(L.evaluations(step)) == _verdicts(theirs.layout.evaluations(step))

    L.archive(step + 1).unlink()
    steps.update_archive(run, step)
    a, b = load_archive(L.archive(step + 1)), load_archive(theirs.layout.archive(step + 1))
    assert list(a.states.values()) == list(b.states.values()) and a.total_expansions == b.total_expansions

    shutil.rmtree(L.checkpoint(step + 1))
    steps.train(run, step)
    assert_adapters_close(L.checkpoint(step + 1), theirs.layout.checkpoint(step + 1))
    stats, v1_stats = (json.loads(p.read_text()) for p in (L.train_stats(step), theirs.layout.train_stats(step)))
    for name in ("loss", "kl", "grad_norm", "mean_ratio", "max_ratio"):
        assert stats[name] == pytest.approx(v1_stats[name], rel=1e-3, abs=1e-6), name
    assert [stats[n] for n in ("groups_with_signal", "tokens", "trained")] == [
        v1_stats[n] for n in ("groups_with_signal", "tokens", "trained")
    ]
    assert (stats["beta_mean"] is None) == (v1_stats["beta_mean"] is None)
    assert v1_stats["beta_mean"] is None or stats["beta_mean"] == pytest.approx(
        v1_stats["beta_mean"], rel=1e-9
    )  # libm may differ in the last bit
