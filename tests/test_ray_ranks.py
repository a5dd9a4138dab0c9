"""What a trainer rank asks the Ray cluster for (`cluster.trainer_placement: ray`, discover/policy/ray_ranks.py);
the ranks themselves run in tests/test_ray_cluster.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from discover.config import ModelConfig, TrainConfig
from discover.policy.ray_ranks import rank_bundle
from discover.policy.sharded import _Job


def _job(device: str) -> _Job:
    return _Job(
        model=ModelConfig(name="tiny", device=device),
        adapter_dir=None,
        seed=0,
        optimizer_state=None,
        completions=[],
        advantages=[],
        shares=[[], []],
        train=TrainConfig(),
        temperature=1.0,
        out_dir=Path("unused"),
        master="127.0.0.1:1",
        devices=[],
        threads=1,
    )


@pytest.mark.parametrize(
    "device, cluster_gpus, bundle",
    [
        ("cpu", 8.0, {"CPU": 1.0, "trainer": 1.0}),  # a CPU model on a GPU cluster takes no GPU
        ("auto", 0.0, {"CPU": 1.0, "trainer": 1.0}),  # 'auto' on a cluster without GPUs trains on CPUs
        ("auto", 8.0, {"CPU": 1.0, "GPU": 1.0, "trainer": 1.0}),
        ("cuda:3", 0.0, {"CPU": 1.0, "GPU": 1.0, "trainer": 1.0}),  # asked for: without a GPU node the step fails naming the bundle
    ],
)
def test_a_rank_asks_for_one_gpu_where_the_model_trains_on_gpus(device: str, cluster_gpus: float, bundle: dict) -> None:
    assert rank_bundle(_job(device), {"trainer": 1.0}, cluster_gpus) == bundle
