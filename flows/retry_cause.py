"""A retried task's retry state says why: the cause of the failure that is being retried.

Prefect 3.9's task engine builds the state of a task waiting for its retry, `AwaitingRetry`, with no
message (prefect/task_engine.py `handle_retry`), and offers no hook to give it one: the UI and
`prefect task-run inspect` showed a retry without its reason, which only the run's logs held. The
engine asks the task's retry condition (flows/evaluation.py `retry_infrastructure_only`) whether to
retry just before it builds that state, in the same thread and context; the condition notes the
cause here (`note`), and the engine's `AwaitingRetry`, wrapped here (`install`), takes it as its
message. A state built anywhere else, or with a message of its own, is left as Prefect makes it.
tests/test_retry_cause.py fails if a version of Prefect stops building the retry state this way.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

PREFIX = "retrying after "  # how the message of a retry state begins
MAX_CHARS = 2000  # a cause longer than this is cut (a state's message is shown in one line of the UI)

_cause: ContextVar[str | None] = ContextVar("discover_retry_cause", default=None)


def note(err: BaseException) -> None:
    """The cause of the failure the engine is about to retry: its exception's type and text."""
    text = f"{type(err).__name__}: {err}"
    _cause.set(text if len(text) <= MAX_CHARS else text[: MAX_CHARS - 1] + "…")


def install() -> None:
    """Prefect's task engine builds its retry states with the noted cause (idempotent)."""
    import prefect.task_engine as engine

    if getattr(engine.AwaitingRetry, "carries_the_cause", False):
        return
    built_by_prefect = engine.AwaitingRetry

    def awaiting_retry(*args: Any, **kwargs: Any) -> Any:
        cause = _cause.get()
        _cause.set(None)  # one cause, one retry: never a stale one on a later state
        if cause and not kwargs.get("message"):
            kwargs["message"] = PREFIX + cause
        return built_by_prefect(*args, **kwargs)

    awaiting_retry.carries_the_cause = True  # type: ignore[attr-defined]
    engine.AwaitingRetry = awaiting_retry  # type: ignore[assignment]
