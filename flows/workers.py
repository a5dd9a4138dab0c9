"""The run's resident Ray workers for as long as its flow runs (docs/cluster.md): the generation
replicas (discover/policy/replicas.py) and the trainer ranks (discover/policy/trainer_group.py).

With `cluster.generation_replicas` > 1 the run's flow creates (or re-attaches to) the replica actors
once, before its first step, so that a specification that changed is replaced before any step
needs it; each step's `generate` then finds them by name. The trainer ranks
(`cluster.trainer_world_size` > 1) are built by the first `train` that needs them, as that step's
training section is part of their specification, and found by name by every later one.
When the run has finished its last step, both are ended (detached ones on a shared cluster would
otherwise hold their GPUs); when the flow stops early they stay, for the flow that resumes the run.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from discover.run import Run

log = logging.getLogger("discover")


@contextmanager
def resident_workers(run: Run) -> Iterator[None]:
    c = run.config.cluster
    if c.generation_replicas > 1:
        from discover.policy.replicas import ensure_replicas

        actors = ensure_replicas(run)
        log.info("generation on %d replicas (Ray namespace of the run: its id)", len(actors))
    yield
    if run.finished_steps() < run.config.steps:
        return
    if c.generation_replicas > 1:
        from discover.policy.replicas import end_replicas

        log.info("run finished: %d generation replicas ended", end_replicas(run))
    if c.trainer_world_size > 1:
        from discover.policy.trainer_group import TrainerGroup

        log.info("run finished: %d trainer ranks ended", TrainerGroup.of_run(run).end())
