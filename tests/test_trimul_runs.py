"""TriMul in a run (Must show 3 and 4): a two-step discovery run on the tiny model completes with the
initial kernel in the archive (reward 0 with the "no GPU" reason on a machine without one, its
measured reward where a GPU exists), and the re-evaluation flow re-times a kernel run's best
kernels into a table named by GPU type, with a clear "no GPU" verdict on CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from discover.archive import Archive, State
from discover.config import dump_config, parse_config
from discover.reevaluation import NO_GPU
from discover.run import save_archive
from evaluators.kernels.trimul.problem import INITIAL_KERNEL
from evaluators.sandbox.gpus import local_gpus
from storage.atomic import atomic_write_json, atomic_write_text
from storage.layout import RunLayout
from tests.conftest import RUN_SCRIPT, archive_records
from tests.trimul_kernels import CORRECT_TORCH

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_two_steps_of_trimul_keep_the_initial_kernel(tmp_path: Path, long_context_tiny_model: Path, cli_env: dict[str, str]) -> None:
    run_dir = tmp_path / "trimul"
    config = {
        "problem": "trimul",
        "run_dir": str(run_dir),
        "steps": 2,
        "groups": 2,
        "rollouts_per_group": 2,
        "model": {"name": str(long_context_tiny_model), "lora_rank": 4, "device": "cpu", "micro_batch_tokens": 1},  # one rollout per pass
        "sampling": {"context_tokens": 8192, "thinking_budget": 8192, "max_answer_tokens": 8},
        "sandbox": {"backend": "process", "concurrency": 2, "max_processes": 256},
    }
    path = tmp_path / "trimul.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run(
        [sys.executable, "-c", RUN_SCRIPT, str(path)], env=cli_env, capture_output=True, text=True, timeout=1800, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.split()[0] == "trimul"
    seeds, _ = archive_records(run_dir / "archive" / "0000.parquet")
    # one seed state per group (docs/method.md §5a): 2 copies of the initial kernel, timed once
    assert len(seeds) == 2 and all(s["is_seed"] and s["code"] == INITIAL_KERNEL for s in seeds)
    assert seeds[0]["reward"] == seeds[1]["reward"]
    last, _ = archive_records(run_dir / "archive" / "0002.parquet")
    assert {"seed-0", "seed-1"} <= {r["id"] for r in last}
    if local_gpus():
        assert seeds[0]["reward"] > 0  # measured on this machine's GPU
    else:
        assert seeds[0]["reward"] == 0.0
        assert "not timed: no CUDA GPU" in proc.stderr and "correct on the CPU check" in proc.stderr
    for step in (0, 1):
        rewards = pq.read_table(run_dir / "steps" / f"{step:04d}" / "evaluations.parquet").column("reward").to_pylist()
        assert len(rewards) == 4  # every rollout evaluated (the tiny model writes no kernel: all 0)


def _kernel_run(root: Path) -> Path:
    """A TriMul run directory written by hand: the seed and two kernels found at step 0."""
    layout = RunLayout(root)
    config = parse_config({"problem": "trimul", "run_dir": str(root), "sandbox": {"backend": "process"}})
    atomic_write_text(layout.config, dump_config(config))
    atomic_write_json(layout.run_info, {"run_id": "feedfacefeedface", "created": 0.0})
    seed = State(id="seed-0", parent_id=None, step=-1, reward=0.0, code=INITIAL_KERNEL, is_seed=True)
    kernels = [
        State(id=f"s0000-g00-r00{i}", parent_id="seed-0", step=0, reward=r, code=code, lineage=("seed-0",))
        for i, (r, code) in enumerate(((0.8, CORRECT_TORCH), (0.5, INITIAL_KERNEL + "\n# variant\n")))
    ]
    save_archive(layout.archive(0), Archive([seed], 0))
    save_archive(layout.archive(1), Archive([seed, *kernels], 1))
    return root


@pytest.mark.slow
def test_the_reevaluation_flow_writes_a_table_named_by_gpu_type(tmp_path: Path, prefect_api, monkeypatch) -> None:
    from flows.reevaluate_flow import reevaluate

    monkeypatch.delenv("DISCOVER_GPU_TYPE", raising=False)
    run = _kernel_run(tmp_path / "kernels")
    out = Path(reevaluate(run_dir=str(run), top_k=5))
    rows = pq.read_table(out).to_pylist()
    assert [r["state_id"] for r in rows] == ["s0000-g00-r000", "s0000-g00-r001"]  # best first, no seed
    markdown = out.with_suffix(".md").read_text()
    if local_gpus():
        assert local_gpus()[0].name.replace(" ", "-") in out.name
        assert all(r["valid"] and r["geomean_us"] > 0 for r in rows)
        assert any(c.startswith("us B2 N256 C128") for c in rows[0])  # a runtime column per benchmark shape
    else:
        assert out.parent == run / "reevaluations" and out.name.endswith("-no-GPU-local.parquet")
        assert all(not r["valid"] and r["reward"] == 0.0 and r["reason"] == NO_GPU and r["gpu"] == "none" for r in rows)
        assert f"**{NO_GPU}.**" in markdown


def test_each_gpu_pool_declares_the_gpu_type_a_scheduled_retiming_carries() -> None:
    """`discover schedule runs/trimul --pool gpu-h100 ...` gives the deployment the job variables
    prefect.yaml declares for the pool (flows/schedules.py): its GPU type, its GPU limit."""
    from flows.schedules import pool_definition

    spec = yaml.safe_load((REPO / "prefect.yaml").read_text())
    deployments = {d["name"]: d for d in spec["deployments"]}
    for pool, gpu in (("gpu-h100", "H100"), ("gpu-a100", "A100")):
        job_variables, gpus = pool_definition(REPO / "prefect.yaml", pool)
        assert job_variables["env"]["DISCOVER_GPU_TYPE"] == gpu and job_variables["env"]["DISCOVER_GPU_LIMIT"] == pool and gpus == 8
        d = deployments[pool]  # the by-hand deployment of the same pool: the same job variables, no run of its own
        assert d["entrypoint"] == "flows/reevaluate_flow.py:reevaluate" and d["work_pool"]["job_variables"] == job_variables
        assert "run_dir" not in d["parameters"] and not d.get("schedules")
    with pytest.raises(ValueError, match="declares no work pool 'gpu-x'"):
        pool_definition(REPO / "prefect.yaml", "gpu-x")
