"""The run's generation replicas for as long as its flow runs (discover/policy/replicas.py, docs/cluster.md).

With `cluster.generation_replicas` > 1 the run's flow creates (or re-attaches to) the replica actors
once, before its first step, so that a specification that changed is replaced before any step
needs it; each step's `generate` then finds them by name. When the run has finished its last step,
the replicas are ended (detached ones on a shared cluster would otherwise hold their GPUs);
when the flow stops early they stay, for the flow that resumes the run.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from discover.run import Run

log = logging.getLogger("discover")


@contextmanager
def generation_replicas(run: Run) -> Iterator[None]:
    if run.config.cluster.generation_replicas == 1:
        yield
        return
    from discover.policy.replicas import end_replicas, ensure_replicas

    actors = ensure_replicas(run)
    log.info("generation on %d replicas (Ray namespace of the run: its id)", len(actors))
    yield
    if run.finished_steps() >= run.config.steps:
        log.info("run finished: %d generation replicas ended", end_replicas(run))
