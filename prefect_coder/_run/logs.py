"""Where our lines go: the run's log, a turn's story, and transport events at DEBUG."""

from __future__ import annotations

import logging
from typing import ParamSpec, TypeVar

from prefect import get_run_logger
from prefect.exceptions import MissingContextError
from prefect.logging.handlers import APILogHandler
from prefect.logging.loggers import LoggingAdapter, PrefectLogAdapter

from coder_chat.client.events import TransportEvent, WsEvent

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")


def run_log() -> LoggingAdapter:
    """The run's logger, named ``prefect.{flow,task}_runs.coder`` so our lines stand apart
    from Prefect's own (they reach the run's logs the same way)."""
    adapter = get_run_logger()
    assert isinstance(adapter, logging.LoggerAdapter)
    own = logging.getLogger(f"{adapter.logger.name}.coder")
    return PrefectLogAdapter(own, adapter.extra)


def story_log() -> LoggingAdapter:
    """Where a turn's story is told: the run's log in Prefect (what the UI shows), and not
    the console: a line costs a step about 0.7 ms through both, most of it in the console's
    handler, and a turn tells a line or more."""
    adapter = get_run_logger()
    assert isinstance(adapter, logging.LoggerAdapter)
    own = logging.getLogger(f"{adapter.logger.name}.coder.story")
    if own.propagate:
        own.handlers = [h for h in adapter.logger.handlers if isinstance(h, APILogHandler)]
        own.propagate = not own.handlers  # no API handler configured: as every other line
    return PrefectLogAdapter(own, adapter.extra)


#: Where transport lines go (a task run's, as the turns run in tasks); when that logger
#: keeps no DEBUG line, an event costs one check and nothing is formatted.
_TRANSPORT_LOGGER = logging.getLogger("prefect.task_runs.coder")


def log_transport(event: TransportEvent) -> None:
    """A transport event as a DEBUG line of the run it happened in (stream traffic left out)."""
    if isinstance(event, WsEvent) or not _TRANSPORT_LOGGER.isEnabledFor(logging.DEBUG):
        return
    try:
        log = run_log()
    except MissingContextError:
        return
    fields: dict[str, object] = {}
    for name, value in vars(event).items():
        if name == "duration" and isinstance(value, float):
            fields["duration_ms"] = round(value * 1000, 1)
        elif name != "type" and value is not None:
            fields[name] = value
    note = _EXPECTED_CONFLICTS.get(str(fields.get("op"))) if fields.get("status") == 409 else None
    line = f"{event.type} " + " ".join(f"{k}={v}" for k, v in fields.items())
    log.debug(f"{line} ({note})" if note else line)


#: 409s that are part of the normal path, said in words where they are logged.
_EXPECTED_CONFLICTS = {
    "update_chat": "expected: Coder refuses to archive while a stopped run winds down; retried",
    "interrupt_chat": "expected: nothing was running, so there was nothing to interrupt",
}
