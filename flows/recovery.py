"""A run that looks after itself: when the machine or the worker running it dies, Prefect notices
and starts it again, and the new attempt resumes where the old one stopped (docs/operations.md,
"Automatic recovery").

Three parts, all Prefect's own means:

- **Heartbeats.** A flow run's process sends `prefect.flow-run.heartbeat` events every
  `PREFECT_FLOWS_HEARTBEAT_FREQUENCY` seconds (prefect.yaml sets it for the discovery pools, the
  CLI for the runs it starts: cli/app.py `_heartbeats`).
- **Two automations** on the server (`ensure_automations`, run by `discover setup`):
  `discover-crash-silent-runs` marks a flow run of this project CRASHED when no heartbeat came for
  `SILENCE_S` seconds (`discover setup --silence`) while it was running (its worker or its machine
  died: nothing else would tell the server), and `discover-restart-crashed-runs` schedules a
  `discovery-run` that was reported CRASHED and showed no sign of life for RESTART_DELAY_S since
  (no heartbeat, no new state), once per crash however many times it was reported. A worker of its
  pool picks it up, and the run resumes (a finished task never runs again). Should a second attempt
  start all the same, it finds the run directory's lease held by the live one and ends at once
  (flows/writer.py).
- **A guard against restarting for ever** (`guard_restarts`): an attempt of a flow run records
  how many tasks had finished when it started; when `MAX_RESTARTS_WITHOUT_PROGRESS` restarts in a
  row found no task finished since the attempt before, the attempt fails (FAILED, which no
  automation restarts) with a message saying where the run stops and why.

The superseded runs of a step or a run are put in a final state when the step or run starts again
(`end_superseded_runs`), so no flow or task run stays RUNNING for ever in the UI.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import timedelta
from typing import Any

from discover.run import Run
from flows.server_api import server_client
from storage.atomic import atomic_write_json
from storage.manifest import read_manifest

log = logging.getLogger("discover")

HEARTBEAT_S = 30  # PREFECT_FLOWS_HEARTBEAT_FREQUENCY of the discovery pools (Prefect's minimum is 30)
SILENCE_S = 120  # no heartbeat for this long while RUNNING: the run's process is gone (`discover setup --silence`)
# One death is often reported CRASHED twice: by the process that ran the flow and, 6-22 s later
# (seen here), by its worker. Restarting on each report started two attempts, the second report
# landing on the first restart. So the restart waits this long after a report and happens only if
# the flow run showed no sign of life meanwhile; a later report finds the run CRASHED already, which
# Prefect does not record again.
RESTART_DELAY_S = 60
# The Prefect server's setting under which its automations see a run's state changes on time after a
# restart of the server (flows/event_ordering.py; Prefect's default holds them back 15 minutes, too late).
SERVER_ORDERING = ("PREFECT_SERVER_EVENTS_CAUSAL_ORDERING", "flows.event_ordering")
MAX_RESTARTS_WITHOUT_PROGRESS = 3
CRASH_SILENT = "discover-crash-silent-runs"
RESTART_CRASHED = "discover-restart-crashed-runs"
WATCHED_FLOWS = ["discovery-run", "discovery-step", "reevaluate"]
RESTARTED_FLOW = "discovery-run"
ATTEMPTS_FILE = "attempts.json"


class RunStalled(RuntimeError):
    """Restarted too often without a task finishing: stop restarting and say where."""


def automations(silence_s: int = SILENCE_S) -> list[Any]:
    """The two automations of automatic recovery (see the module). `silence_s` well above the
    heartbeat period: a live run whose heartbeat is merely late must not be marked crashed (it would
    be started a second time)."""
    if silence_s < HEARTBEAT_S * 1.5:
        raise ValueError(
            f"a silence of {silence_s} s is too close to the {HEARTBEAT_S} s between heartbeats; use at least {HEARTBEAT_S * 1.5:.0f}"
        )
    from prefect.automations import AutomationCore, ChangeFlowRunState, EventTrigger, Posture
    from prefect.client.schemas.objects import StateType

    ends = {f"prefect.flow-run.{s}" for s in ("Completed", "Failed", "Cancelled", "Crashed", "Paused", "Suspended")}
    alive = {f"prefect.flow-run.{s}" for s in ("Scheduled", "Pending", "Running", "Cancelling", "AwaitingRetry", "Retrying")}
    silent = AutomationCore(
        name=CRASH_SILENT,
        description=f"A flow run of ttt-discover that sent no heartbeat for {silence_s} s while running lost its process: CRASHED.",
        trigger=EventTrigger(
            match={"prefect.resource.id": "prefect.flow-run.*"},
            match_related={"prefect.resource.role": "flow", "prefect.resource.name": WATCHED_FLOWS},
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", *ends},
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=silence_s),
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED,
                message=f"no heartbeat for {silence_s} s: its worker or machine died (automation {CRASH_SILENT})",
            )
        ],
    )
    restart = AutomationCore(
        name=RESTART_CRASHED,
        description="A crashed discovery run is scheduled again; a worker of its pool resumes it where it stopped.",
        trigger=EventTrigger(
            match={"prefect.resource.id": "prefect.flow-run.*"},
            match_related={"prefect.resource.role": "flow", "prefect.resource.name": RESTARTED_FLOW},
            after={"prefect.flow-run.Crashed"},
            # Crashed is also expected: a report that comes while the window of an earlier one is
            # open starts a new window from itself (as heartbeats do in the rule above). Without it,
            # a real crash within RESTART_DELAY_S of a false one (a live run marked CRASHED, then
            # RUNNING again) was counted in the old window, already answered by the RUNNING, and
            # never restarted (Prefect's `ensure_bucket` keeps an open window as it is).
            expect={"prefect.flow-run.heartbeat", *alive, *ends},
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,  # once per crash, not per report of it (RESTART_DELAY_S)
            threshold=1,
            within=timedelta(seconds=RESTART_DELAY_S),
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.SCHEDULED,
                force=True,
                message=f"restarted after a crash (automation {RESTART_CRASHED}); it resumes where it stopped",
            )
        ],
    )
    return [silent, restart]


def ensure_automations(silence_s: int = SILENCE_S) -> list[str]:
    """Create the automations, or replace ones of the same name (idempotent); their names and verbs."""
    from prefect.client.orchestration import get_client

    done = []
    with get_client(sync_client=True) as client:
        existing = {a.name: a for a in client.read_automations()}
        for automation in automations(silence_s):
            if automation.name in existing:
                client.delete_automation(existing[automation.name].id)
            client.create_automation(automation)
            done.append(f"{automation.name} ({'replaced' if automation.name in existing else 'created'})")
    return done


# -- a new attempt of a run or a step -----------------------------------------------------------


def guard_restarts(run: Run, flow_run_id: str, run_count: int) -> None:
    """Record this attempt of flow run `flow_run_id` in RUN_DIR/attempts.json; raise RunStalled when
    it is a restart and the last MAX_RESTARTS_WITHOUT_PROGRESS attempts of this flow run, this one
    included, all started with the same number of finished tasks (no progress in between). A new flow
    run (`discover resume`, a new deployment run) always starts."""
    path = run.root / ATTEMPTS_FILE
    attempts: dict[str, list[dict[str, Any]]] = json.loads(path.read_text()) if path.is_file() else {}
    finished = len(read_manifest(run.layout.manifest)["tasks"])
    mine = [*attempts.get(flow_run_id, []), {"run_count": run_count, "finished_tasks": finished, "started": time.time()}]
    attempts[flow_run_id] = mine
    atomic_write_json(path, attempts)
    last = mine[-(MAX_RESTARTS_WITHOUT_PROGRESS + 1) :]
    if run_count > 1 and len(last) > MAX_RESTARTS_WITHOUT_PROGRESS and len({a["finished_tasks"] for a in last}) == 1:
        step = run.finished_steps()
        raise RunStalled(
            f"{run.root}: {MAX_RESTARTS_WITHOUT_PROGRESS} restarts in a row found no task finished since the attempt before "
            f"(stuck in step {step}); not restarting again. Look at the crashed attempts' logs (the machine's memory, "
            f"a GPU that fails), then resume it: `discover resume {run.root}` from a shell, or, to keep it on its deployment's "
            f"workers, `prefect flow-run retry {flow_run_id}`"
        )


def end_superseded_runs(flow_name: str, tags: list[str], current: str | None, reason: str) -> int:
    """Put every flow run of flow `flow_name` carrying all of `tags` that is not final (and is not
    `current`) in a final state, and the task runs such runs left RUNNING or PENDING, also where the
    flow run itself was already marked CRASHED (by the automation that watches heartbeats): a whole
    run superseded by another is CANCELLED (so the restart automation leaves it alone), a step's run
    is CRASHED (its process is gone). Returns how many flow runs it ended."""
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterTags,
        TaskRunFilter,
        TaskRunFilterFlowRunId,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelled, Crashed

    live = [StateType.RUNNING, StateType.PENDING, StateType.SCHEDULED, StateType.PAUSED, StateType.CANCELLING]
    ended = 0
    with server_client("ending earlier flow runs of the run") as client:
        earlier = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])),
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=tags)),
        )
        for flow_run in earlier:
            if current is not None and str(flow_run.id) == str(current):
                continue
            if flow_run.state is not None and flow_run.state.type in live:
                final = Cancelled(message=reason) if flow_name == RESTARTED_FLOW else Crashed(message=reason)
                client.set_flow_run_state(flow_run.id, final, force=True)
                ended += 1
            elif flow_run.state is None or flow_run.state.type != StateType.CRASHED:
                continue  # completed, failed or cancelled: its task runs ended with it
            tasks = client.read_task_runs(
                task_run_filter=TaskRunFilter(
                    flow_run_id=TaskRunFilterFlowRunId(any_=[flow_run.id]),
                    state=TaskRunFilterState(type=TaskRunFilterStateType(any_=live)),
                )
            )
            for task_run in tasks:
                client.set_task_run_state(task_run.id, Crashed(message=reason), force=True)
    if ended:
        log.info("%d earlier flow run(s) of %s put in a final state: %s", ended, ", ".join(tags), reason)
    return ended
