"""The cache key of a step task (docs/architecture.md, "Retry, cache, resume"), composed from
Prefect's cache policies: Prefect's TASK_SOURCE (the task's own source) + the code its step
function runs + the run's inputs, i.e. the discovery run id, its redo epoch, the step and the
content hash of exactly the files `Run.reads` declares for the task (discover/run.py).

The cache is for a task that is not recorded as finished in the manifest: a task that is recorded
is never called again (flows/step_flow.py), whatever its key would be now. So a change of code
between a kill and a resume re-runs only the unfinished tasks, with the new code.

The code is the step function's name and `source_digest(module_closure("discover.steps"))`
(discover/code_version.py): the source of discover/steps.py and of every project module it
imports, directly or through another (prompts, archive, the policy backends, the problems and
their sandboxes, storage), so an edit in a helper a step function calls makes its task run again.
The digest is over the whole closure, not the one function's callees: an edit anywhere in it
re-runs every step task, which is cautious but never stale.

Prefect's own RUN_ID policy is the *flow run* id, which changes when `discover resume` starts a
new flow run, so the discovery run's id (run.json) stands in for it. The redo epoch (the number of
`discover resume --redo-from` so far) keeps a recomputed step from taking a result cached before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefect.cache_policies import TASK_SOURCE, CachePolicy
from prefect.utilities.hashing import hash_objects

from discover.code_version import module_closure, source_digest
from discover.run import Run

STEPS_MODULE = "discover.steps"


def steps_code_digest() -> str:
    """The digest of discover/steps.py and every project module it imports (cached per process)."""
    return source_digest(module_closure(STEPS_MODULE))


@dataclass
class StepSource(CachePolicy):
    """The code a task's step function runs: its name and the digest of discover.steps' closure."""

    name: str = ""

    def compute_key(self, task_ctx: Any, inputs: dict[str, Any], flow_parameters: dict[str, Any], **kwargs: Any) -> str | None:
        return hash_objects(self.name, steps_code_digest(), raise_on_failure=True)


@dataclass
class RunInputs(CachePolicy):
    """The discovery run's id and redo epoch, the step, and the content hash of each file the task reads."""

    name: str = ""

    def compute_key(self, task_ctx: Any, inputs: dict[str, Any], flow_parameters: dict[str, Any], **kwargs: Any) -> str | None:
        run: Run = inputs["run"]
        step = int(inputs["step"])
        return hash_objects(run.run_id, run.epoch(), step, sorted(run.input_hashes(self.name, step).items()), raise_on_failure=True)


def step_cache_policy(name: str) -> CachePolicy:
    """The cache policy of the task that calls `discover.steps.<name>`."""
    return TASK_SOURCE + StepSource(name=name) + RunInputs(name=name)
