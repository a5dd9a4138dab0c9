"""The project's log lines in Prefect: what the `discover` logger says during a flow run ("resuming
... at step N", "step N/M", each task's summary, the best state, a seed's warning) goes to that
flow run's logs on the server, so `prefect flow-run logs ID` and the UI show it, as well as to
wherever the logger already writes (the CLI's terminal, a worker's output).

A record logged inside a flow or task run belongs to that run (Prefect's own rule); one logged in a
thread the run started without Prefect's context (a candidate's evaluation thread, say) belongs to
the flow run that called `forward_project_logs` in this process. Outside any run, nothing is sent.
"""

from __future__ import annotations

import logging
import sys
import uuid
from typing import Any

from prefect.context import FlowRunContext
from prefect.logging.handlers import APILogHandler

PROJECT_LOGGER = "discover"


class _ProjectLogHandler(APILogHandler):
    """Prefect's API log handler for the project's logger: a record without a run of its own is
    sent to the flow run this process is running, and outside any run it is dropped quietly."""

    flow_run_id: uuid.UUID | None = None

    def prepare(self, record: logging.LogRecord) -> dict[str, Any]:
        if getattr(record, "flow_run_id", None) is None and _ProjectLogHandler.flow_run_id is not None:
            from prefect.context import get_run_context
            from prefect.exceptions import MissingContextError

            try:
                get_run_context()
            except MissingContextError:
                record.flow_run_id = _ProjectLogHandler.flow_run_id
        return super().prepare(record)

    def handleError(self, record: logging.LogRecord) -> None:
        from prefect.exceptions import MissingContextError

        if isinstance(sys.exc_info()[1], MissingContextError):
            return  # a line logged outside any flow run: the terminal has it
        super().handleError(record)


def forward_project_logs() -> None:
    """Send the project logger's records to the current flow run's logs from now on (idempotent;
    called at the start of each flow). INFO and above, whatever the logger's own level was."""
    logger = logging.getLogger(PROJECT_LOGGER)
    if not any(isinstance(h, APILogHandler) for h in logger.handlers):  # PREFECT_LOGGING_EXTRA_LOGGERS may have added one
        logger.addHandler(_ProjectLogHandler(level=logging.INFO))
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)
    ctx = FlowRunContext.get()
    if ctx is not None and ctx.flow_run is not None and ctx.flow_run.parent_task_run_id is None:
        _ProjectLogHandler.flow_run_id = ctx.flow_run.id
