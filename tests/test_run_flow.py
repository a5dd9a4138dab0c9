"""A real discovery run through Prefect on the toy problem: what a user finds afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import yaml

from tests.conftest import tiny_toy_config

pytestmark = pytest.mark.slow


def test_a_two_step_run_leaves_a_run_directory_users_can_query(tmp_path: Path, cli_env: dict[str, str]) -> None:
    run_dir = tmp_path / "run"
    config = tiny_toy_config(run_dir)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    env = cli_env
    cli = [sys.executable, "-m", "cli"]
    proc = subprocess.run([*cli, "run", str(tmp_path / "c.yaml")], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # progress is shown while it works
    for line in ("step 1/2", "step 2/2", "generate: 8 rollouts", "evaluate:", "train:"):
        assert line in proc.stderr
    assert "best state" in proc.stdout

    # the archive opens in DuckDB with each state's code, reward, parent, step and lineage
    archive = run_dir / "archive" / "0002.parquet"
    rows = duckdb.sql(f"select state_id, reward, parent_id, step, lineage, code from '{archive}' order by reward desc").fetchall()
    seeds = {"seed-0", "seed-1"}  # one seed state per group (docs/method.md §5a), 2 groups
    assert rows and seeds <= {r[0] for r in rows}
    for state_id, reward, parent_id, step, lineage, _code in rows:
        if state_id not in seeds:
            assert parent_id == lineage[-1] and lineage[0] in seeds and step in (0, 1) and reward >= 0
    # every rollout, valid or not, is kept with its reward and reason
    evals = duckdb.sql(f"select valid, reward, reason from '{run_dir}/steps/0001/evaluations.parquet'").fetchall()
    assert len(evals) == 8 and all((v and reason == "") or (not v and reward == 0.0 and reason) for v, reward, reason in evals)
    rollouts = duckdb.sql(f"select sampler_logprobs, completion_ids from '{run_dir}/steps/0000/rollouts.parquet'").fetchall()
    assert all(len(lp) == len(ids) > 0 for lp, ids in rollouts)
    assert (run_dir / "checkpoints" / "0002" / "adapter" / "adapter_model.safetensors").is_file()
    # the optimizer's state is kept from the first step that trained (a step without signal at the
    # base model trains nothing, docs/method.md §2)
    trained = [json.loads((run_dir / "steps" / f"{s:04d}" / "train.json").read_text())["optimizer_step"] for s in (0, 1)]
    assert (run_dir / "checkpoints" / "0002" / "optimizer.pt").is_file() == any(trained)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert len(manifest["tasks"]) == 10

    status = subprocess.run([*cli, "status", str(run_dir)], env=env, capture_output=True, text=True, timeout=120)
    assert status.returncode == 0 and "2/2 steps" in status.stdout and "generate" in status.stdout

    # running the finished configuration again repeats nothing
    again = subprocess.run([*cli, "run", str(tmp_path / "c.yaml")], env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "resuming" in again.stderr
    assert len(json.loads((run_dir / "manifest.json").read_text())["executions"]) == 10

    # a different configuration in the same run directory is refused, naming the fix
    config["seed"] = 99
    (tmp_path / "c2.yaml").write_text(yaml.safe_dump(config))
    clash = subprocess.run([*cli, "run", str(tmp_path / "c2.yaml")], env=env, capture_output=True, text=True, timeout=600)
    assert clash.returncode == 2 and "another configuration" in clash.stderr
