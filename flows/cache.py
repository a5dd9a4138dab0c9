"""The cache key of a step task (DESIGN.md, "Retry, cache, resume"), composed from Prefect's
cache policies: Prefect's TASK_SOURCE (the task's own source) + the source of the step function it
calls + the run's inputs, i.e. the discovery run id, the step and the content hash of exactly the
files `Run.reads` declares for the task (discover/run.py).

Prefect's own RUN_ID policy is the *flow run* id, which changes when `discover resume` starts a
new flow run, so the discovery run's id (run.json) stands in for it. What can still go stale: a
change in a helper that a step function calls (its own source is hashed, its callees' are not);
delete RUN_DIR/prefect-results/ to make every task run again.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from prefect.cache_policies import TASK_SOURCE, CachePolicy
from prefect.utilities.hashing import hash_objects

from discover import steps
from discover.run import Run


@dataclass
class StepSource(CachePolicy):
    """The source of the step function (discover/steps.py) that a task calls."""

    name: str = ""

    def compute_key(self, task_ctx: Any, inputs: dict[str, Any], flow_parameters: dict[str, Any], **kwargs: Any) -> Optional[str]:
        return hash_objects(self.name, inspect.getsource(getattr(steps, self.name)), raise_on_failure=True)


@dataclass
class RunInputs(CachePolicy):
    """The discovery run's id, the step, and the content hash of each file the task reads."""

    name: str = ""

    def compute_key(self, task_ctx: Any, inputs: dict[str, Any], flow_parameters: dict[str, Any], **kwargs: Any) -> Optional[str]:
        run, step = Run.open(Path(inputs["run_dir"])), int(inputs["step"])
        return hash_objects(run.run_id, step, sorted(run.input_hashes(self.name, step).items()), raise_on_failure=True)


def step_cache_policy(name: str) -> CachePolicy:
    """The cache policy of the task that calls `discover.steps.<name>`."""
    return TASK_SOURCE + StepSource(name=name) + RunInputs(name=name)
