"""The flow run that writes a run directory (docs/runs.md, "One writer").

`writer_lease(run)` takes the run directory's lease (storage/lease.py) for the flow run before it
changes anything, on the server or on disk, and holds it until the flow run ends:

- held by another live process of the **same flow run** (a crash reported twice made the server
  start it again while the first restart still works): this process is a duplicate attempt and ends
  at once without a state of its own (Prefect's `Abort`: the process exits 0, the live attempt keeps
  the flow run), saying so in the flow run's logs;
- held by anything else (another `discover resume`, another deployment run, a `discover run`): wait
  up to DISCOVER_LEASE_WAIT_S seconds (default LEASE_WAIT_S) for it to let go, then fail with
  RunBusy naming the holder (host, pid, flow run), before touching the other's flow run.

Each process that asks is a line of RUN_DIR/writers.jsonl (who, when, and whether it became the
writer, was refused or was a duplicate).

`at_task_boundary()` runs before every task of a step: a flow run that was cancelled (on the server,
from the UI or `prefect flow-run cancel`, which cannot stop a process no worker started) stops here
and ends CANCELLED; one the server believes crashed or scheduled again while this process, which
holds the lease, is alive (a late crash report of the process before) is set RUNNING again, so no
second attempt is started for it.
"""

from __future__ import annotations

import contextvars
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prefect.exceptions import Abort

from discover.run import Run
from flows.server_api import server_client
from storage.lease import Lease, RunBusy, acquire, describe, record_writer, this_process

log = logging.getLogger("discover")

LEASE_WAIT_ENV = "DISCOVER_LEASE_WAIT_S"
LEASE_WAIT_S = 60.0  # long enough for a holder that is finishing to let go; the holder may run for days

# The flow run that holds the lease in this process (set by `writer_lease`, read at each task boundary).
_holder: contextvars.ContextVar[str | None] = contextvars.ContextVar("discover_lease_holder", default=None)


class RunCancelled(Abort):
    """The flow run was cancelled on the server; the process stopped at a task boundary. Prefect's
    `Abort`: the engines propose no state of their own (the flow runs are CANCELLED already) and a
    worker's process exits 0."""


def lease_wait_s() -> float:
    value = os.environ.get(LEASE_WAIT_ENV, "").strip()
    if not value:
        return LEASE_WAIT_S
    try:
        return max(0.0, float(value))
    except ValueError:
        raise ValueError(f"{LEASE_WAIT_ENV}={value!r} is not a number of seconds") from None


@contextmanager
def writer_lease(run: Run) -> Iterator[Lease]:
    """Hold the run directory's lease for the calling flow run (see the module)."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    me = ctx.flow_run if ctx is not None else None
    ident: dict[str, Any] = {"command": " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]])[:200]}
    if me is not None:
        ident.update(flow_run_id=str(me.id), flow_run_name=me.name)

    def waiting(holder: dict[str, Any]) -> None:
        log.info("%s is held by %s; waiting up to %.0f s for it to let go", run.root, describe(holder), wait)

    wait, asking = lease_wait_s(), this_process(**ident)
    try:
        lease = acquire(run.root, asking, wait_s=0.0)
    except RunBusy as busy:
        if me is not None and busy.holder.get("flow_run_id") == str(me.id):
            record_writer(run.root, asking, "duplicate")
            _duplicate_attempt(run, busy.holder)
        try:
            lease = acquire(run.root, asking, wait_s=wait, on_wait=waiting)
        except RunBusy:
            record_writer(run.root, asking, "refused")
            raise
    record_writer(run.root, lease.holder, "writer")
    token = _holder.set(ident.get("flow_run_id", ""))
    try:
        with lease:
            yield lease
    finally:
        _holder.reset(token)


def _duplicate_attempt(run: Run, holder: dict[str, Any]) -> None:
    """End this process of a flow run another live process of it already works on."""
    message = (
        f"another process of this flow run, {describe(holder)}, is working on {run.root}: this duplicate "
        "attempt (a crash reported twice) ends here without a state, and that process keeps the flow run"
    )
    log.warning(message)
    _flush_logs()
    raise Abort(message)


def _flush_logs() -> None:
    """Send the log lines buffered for the server now (the process is about to exit)."""
    try:
        from prefect.logging.handlers import APILogHandler

        APILogHandler.flush()
    except Exception:  # noqa: BLE001 - a log line that does not reach the server is no reason to fail
        pass


def at_task_boundary(run: Run, what: str) -> None:
    """Before `what` (a step's task): stop if the flow run holding the lease was cancelled; claim it
    back when the server thinks it crashed or scheduled it again (see the module)."""
    holder = _holder.get()
    if not holder:
        return  # not inside a flow run that holds the lease (a step run on its own, a test)
    from prefect.client.schemas.objects import StateType
    from prefect.context import FlowRunContext
    from prefect.states import Cancelled, Running

    with server_client(f"checking the run's flow run before {what}") as client:
        flow_run = client.read_flow_run(holder)
        state = flow_run.state.type if flow_run.state is not None else None
        if state in (StateType.CANCELLING, StateType.CANCELLED):
            stopped = Cancelled(message=f"cancelled; stopped before {what}")
            if state is StateType.CANCELLING:
                client.set_flow_run_state(flow_run.id, stopped, force=True)
            ctx = FlowRunContext.get()
            if ctx is not None and ctx.flow_run is not None and str(ctx.flow_run.id) != holder:  # the step's subflow run
                client.set_flow_run_state(ctx.flow_run.id, stopped, force=True)
            log.warning("flow run %s of %s was cancelled: stopped before %s", flow_run.name, run.root, what)
            _flush_logs()
            raise RunCancelled(
                f"flow run {flow_run.name} of {run.root} was cancelled; stopped before {what}. Resume it with `discover resume {run.root}`"
            )
        if state in (StateType.CRASHED, StateType.SCHEDULED, StateType.PENDING):
            me = describe(this_process())
            reason = f"this process ({me}) is alive and holds {run.root}; the server's {state.value} was a late report"
            client.set_flow_run_state(flow_run.id, Running(message=reason), force=True)
            log.warning("flow run %s was %s on the server while it runs: set RUNNING again (%s)", flow_run.name, state.value, reason)


def after_last_boundary(run: Run) -> None:
    """The run finished its last step: a cancel that came after its last task boundary stopped
    nothing, so the flow run is set RUNNING again for its COMPLETED to be recorded (Prefect's server
    accepts only CANCELLED after CANCELLING, and would mark the finished run cancelled)."""
    holder = _holder.get()
    if not holder:
        return
    from prefect.client.schemas.objects import StateType
    from prefect.states import Running

    with server_client("recording that the run finished") as client:
        flow_run = client.read_flow_run(holder)
        if flow_run.state is None or flow_run.state.type is not StateType.CANCELLING:
            return
        reason = "the cancel came after the run's last task boundary: nothing was left to stop, and the run completed"
        client.set_flow_run_state(flow_run.id, Running(message=reason), force=True)
        log.warning("flow run %s of %s was cancelled after its last task: %s", flow_run.name, run.root, reason)
