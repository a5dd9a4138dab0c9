"""The run's resident Ray workers for as long as its flow runs (docs/cluster.md): the generation
replicas (discover/policy/replicas.py) and the trainer ranks (discover/policy/trainer_group.py).

With `cluster.generation_replicas` > 1 the run's flow creates (or re-attaches to) the replica actors
once, before its first step, so that a specification that changed is replaced before any step
needs it; each step's `generate` then finds them by name. The trainer ranks
(`cluster.trainer_world_size` > 1) are built by the first `train` that needs them, as that step's
training section is part of their specification, and found by name by every later one.
When the run has finished its last step, every worker and placement group of its namespace is ended,
however many ranks and replicas it had (detached ones on a shared cluster would otherwise hold their
GPUs); when the flow stops early they stay, for the flow that resumes the run. Workers left on a
cluster the configuration no longer names (W=2 then 1, say) are ended when the next flow run starts
(discover/policy/run_workers.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from discover.run import Run

log = logging.getLogger("discover")


@contextmanager
def resident_workers(run: Run) -> Iterator[None]:
    from discover.policy.run_workers import end_left_workers, record_cluster

    c = run.config.cluster
    resident = c.generation_replicas > 1 or c.trainer_world_size > 1
    end_left_workers(run.root, c.address if resident else None)  # a cluster this configuration no longer uses
    if resident and c.address is not None:
        from discover.policy.replicas import namespace

        record_cluster(run.root, c.address, namespace(run))  # detached workers may live there from now on
    if c.generation_replicas > 1:
        from discover.policy.replicas import ensure_replicas

        actors = ensure_replicas(run)
        log.info("generation on %d replicas (Ray namespace of the run: its id)", len(actors))
    yield
    if run.finished_steps() < run.config.steps or not resident:
        return
    from discover.policy.ray_driver import connected_ray
    from discover.policy.replicas import namespace
    from discover.policy.run_workers import end_namespace, forget_cluster
    from discover.policy.trainer_group import forget_groups

    actors, groups = end_namespace(connected_ray("resident workers"), namespace(run))  # whatever R and W were
    forget_groups(namespace(run))
    log.info("run finished: its %d workers (generation replicas, trainer ranks) and %d placement groups ended", actors, groups)
    forget_cluster(run.root)
