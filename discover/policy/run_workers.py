"""Every resident worker a run left on a Ray cluster, whatever its configuration says now.

A run's replicas and trainer ranks are named actors in the run's Ray namespace (`ttt-<run id>`),
detached on a cluster, with the ranks' placement group named after that namespace. A run can change
its shape between two flow runs: fewer ranks or replicas, or none (`cluster.trainer_world_size: 1`,
which also removes `cluster.address`), or another cluster. So what ends them never counts from the
current configuration: it ends every named actor of the namespace and every placement group whose
name starts with it (`end_namespace`). The cluster the run last put workers on is recorded in the
run directory (`cluster-workers.json`) while they may be alive, so a flow run whose configuration no
longer names that cluster still reaches it (`end_left_workers`, in a process of its own: a process
holds one Ray connection).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

from discover.policy.ray_driver import loopback_host
from storage.atomic import atomic_write_json

log = logging.getLogger("discover")

RECORD = "cluster-workers.json"  # in the run directory: {"address", "namespace"} while workers may be alive there
END_TIMEOUT_S = 180.0  # connecting to the recorded cluster and ending what is there


def named_actors(ray: Any, namespace: str, prefix: str = "") -> list[str]:
    """The names of the live named actors of `namespace` that start with `prefix`."""
    from ray.util import list_named_actors

    return sorted(a["name"] for a in list_named_actors(all_namespaces=True) if a["namespace"] == namespace and a["name"].startswith(prefix))


def end_namespace(ray: Any, namespace: str) -> tuple[int, int]:
    """Kill every named actor of `namespace` and remove every placement group named after it
    (placement groups are named in the driver's namespace, so their names carry the run's); how many
    of each."""
    from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group

    actors = 0
    for name in named_actors(ray, namespace):
        try:
            ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)
            actors += 1
        except ValueError:  # gone meanwhile
            pass
    groups = 0
    for group_id, info in placement_group_table().items():
        if str(info.get("name", "")).startswith(f"{namespace}-") and info.get("state") != "REMOVED":
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(group_id))))
            groups += 1
    return actors, groups


def record_cluster(run_dir: Path, address: str, namespace: str) -> None:
    """Workers of the run may live on the cluster at `address` from now on."""
    atomic_write_json(Path(run_dir) / RECORD, {"address": address, "namespace": namespace})


def recorded_cluster(run_dir: Path) -> dict[str, str] | None:
    path = Path(run_dir) / RECORD
    try:
        record = json.loads(path.read_text())
        return record if isinstance(record, dict) and {"address", "namespace"} <= set(record) else None
    except (OSError, ValueError):
        return None


def forget_cluster(run_dir: Path) -> None:
    (Path(run_dir) / RECORD).unlink(missing_ok=True)


def end_left_workers(run_dir: Path, current_address: str | None) -> None:
    """Before the run's flow connects: workers the run left on a cluster its configuration no longer
    names are ended there (in a child process), and the record forgotten. A cluster that cannot be
    reached is said, with the command that ends them, and the run goes on."""
    record = recorded_cluster(run_dir)
    if record is None or record["address"] == current_address:
        return
    address, namespace = record["address"], record["namespace"]
    command = [sys.executable, "-m", "discover.policy.run_workers", address, namespace]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=END_TIMEOUT_S)
        ended = done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() else None
        why = None if ended else (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    except subprocess.TimeoutExpired:
        ended, why = None, f"no answer in {END_TIMEOUT_S:.0f} s"
    if ended is None:
        log.warning(
            "the run's workers on the Ray cluster at %s (namespace %s), which its configuration no longer names, could not be "
            "ended (%s); end them with: %s",
            address,
            namespace,
            why,
            " ".join(command[1:]).replace("-m ", "python -m ", 1),
        )
        return
    log.info("the run's workers on the Ray cluster at %s, which its configuration no longer names: %s", address, ended)
    forget_cluster(run_dir)


def main(argv: list[str]) -> int:
    """`python -m discover.policy.run_workers ADDRESS NAMESPACE`: end every actor and placement group
    of the run's namespace on the cluster at ADDRESS."""
    import ray

    if len(argv) != 2:
        print("usage: python -m discover.policy.run_workers RAY_ADDRESS NAMESPACE", file=sys.stderr)
        return 2
    address, namespace = argv
    loopback = loopback_host(address)
    extra = {"_node_ip_address": loopback} if loopback else {}
    ray.init(address=address, namespace="prefect", log_to_driver=False, logging_level=logging.ERROR, **extra)
    try:
        actors, groups = end_namespace(ray, namespace)
    finally:
        ray.shutdown()
    print(f"{actors} actors and {groups} placement groups of namespace {namespace} ended")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
