"""The resident trainer group on a Ray instance of this machine (discover/policy/trainer_group.py,
docs/cluster.md "Resident ranks"); on the loopback cluster: tests/test_ray_cluster.py.

- a group is found again by its specification, and a changed one (a new learning rate) is built again;
- a 5-step toy run with `trainer_placement: local` (2 ranks) and 2 generation replicas on the Ray
  instance the run starts reads the base model from disk 2 + 2 times, plus once in the flow's own
  process for the run's new adapter.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from discover.config import ModelConfig, TrainConfig
from discover.policy.trainer_group import TrainerGroup, rank_name
from tests.conftest import tiny_toy_config
from tests.test_ray_cluster import FAULTS, _load_log
from tests.test_sharded_training import local_ray

pytestmark = pytest.mark.slow


def test_an_unchanged_group_is_found_again_and_a_new_learning_rate_builds_it_again(tmp_path: Path) -> None:
    model = ModelConfig(name="tiny", lora_rank=4, device="cpu")
    with local_ray(2) as ray:
        group = TrainerGroup("tests-rebuild", model, 2)
        first = [a._actor_id.hex() for a in group.ensure(TrainConfig(learning_rate=0.01))]
        again = TrainerGroup("tests-rebuild", model, 2)  # as a later step or a resumed flow: by name
        assert [a._actor_id.hex() for a in again.ensure(TrainConfig(learning_rate=0.01))] == first
        rebuilt = [a._actor_id.hex() for a in again.ensure(TrainConfig(learning_rate=0.02))]
        assert not set(rebuilt) & set(first)
        named = [ray.get_actor(rank_name(r), namespace="tests-rebuild")._actor_id.hex() for r in range(2)]
        assert named == rebuilt
        infos = ray.get([ray.get_actor(rank_name(r), namespace="tests-rebuild").info.remote() for r in range(2)])
        assert [i["spec"]["train"]["learning_rate"] for i in infos] == [0.02, 0.02]
        assert again.end() == 2


def test_a_local_five_step_run_loads_the_model_once_per_rank_and_replica(tmp_path: Path, cli_env: dict[str, str]) -> None:
    loads, run_dir = tmp_path / "loads.log", tmp_path / "run"
    config = tiny_toy_config(
        run_dir, steps=5, seed=5, problem_options={"lenient": True}, cluster={"generation_replicas": 2, "trainer_world_size": 2}
    )
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    env = {**cli_env, "PYTHONPATH": str(FAULTS), "DISCOVER_LOAD_LOG": str(loads)}  # the run's Ray instance inherits it
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "run", str(tmp_path / "run.yaml")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    _, err = proc.communicate(timeout=1200)
    assert proc.returncode == 0, err[-3000:]
    for i in range(5):
        assert (run_dir / "checkpoints" / f"{i + 1:04d}" / "adapter").is_dir()
    pids = _load_log(loads)
    assert pids.count(proc.pid) == 1, pids  # initialise: the run's new adapter
    workers = [p for p in pids if p != proc.pid]
    assert len(workers) == 4 and len(set(workers)) == 4, pids  # 2 ranks + 2 replicas, once each
