"""What a resident trainer rank asks the Ray cluster for (discover/policy/trainer_group.py `rank_bundle`);
the ranks themselves run in tests/test_ray_cluster.py, tests/test_sharded_training.py and
tests/test_resident_ranks.py."""

from __future__ import annotations

import pytest

from discover.config import ModelConfig
from discover.policy.trainer_group import rank_bundle


@pytest.mark.parametrize(
    "device, cluster_gpus, bundle",
    [
        ("cpu", 8.0, {"CPU": 1.0, "trainer": 1.0}),  # a CPU model on a GPU cluster takes no GPU
        ("auto", 0.0, {"CPU": 1.0, "trainer": 1.0}),  # 'auto' on a cluster without GPUs trains on CPUs
        ("auto", 8.0, {"CPU": 1.0, "GPU": 1.0, "trainer": 1.0}),
        ("cuda:3", 0.0, {"CPU": 1.0, "GPU": 1.0, "trainer": 1.0}),  # asked for: without a GPU node the group is refused, naming the bundle
    ],
)
def test_a_rank_asks_for_one_gpu_where_the_model_trains_on_gpus(device: str, cluster_gpus: float, bundle: dict) -> None:
    assert rank_bundle(ModelConfig(name="tiny", device=device), {"trainer": 1.0}, cluster_gpus) == bundle
