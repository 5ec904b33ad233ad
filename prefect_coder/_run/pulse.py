"""A flow run's pulse: a Prefect event every few seconds while it holds a workflow, so that
a run whose host died is known for dead in seconds, not at Prefect's next heartbeat.

Prefect's own flow-run heartbeat comes every 30 s at the most often, so a trigger on its
absence waits 40 s or more before anyone acts. The pulse is cheap (one small event, sent
by Prefect's event worker) and the orphan sweep's ``silent`` trigger in
``deployments/prefect.yaml`` listens for it: after a pulse, the next one (or the run's end)
is expected within a few pulses. A run that stops pulsing while it goes on (the workflow
ended but the flow does more) says so with a last event, so that its silence is not
taken for a death.

It beats on a thread of its own, as Prefect's heartbeat does: an event loop busy with a
long turn still pulses.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from prefect.client.orchestration import PrefectClient
from prefect.context import FlowRunContext
from prefect.events import emit_event

#: The event a live run sends every ``pulse_seconds``.
PULSE = "prefect-coder.flow-run.pulse"
#: The event a run sends when it stops pulsing while it goes on.
QUIET = "prefect-coder.flow-run.quiet"
#: Prefect's own flow-run heartbeat.
HEARTBEAT = "prefect.flow-run.heartbeat"
#: A run heard from this recently is alive: the shipped triggers' windows, for a run that
#: pulses and for one that does not (Prefect's heartbeat alone).
PULSE_WINDOW = 15.0
HEARTBEAT_WINDOW = 40.0


class Pulse:
    """Sends :data:`PULSE` for the current flow run every ``seconds`` until stopped."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._about: tuple[dict[str, str], list[dict[str, str]]] | None = None

    def start(self, run_name: str) -> bool:
        """Start pulsing as the run named ``run_name``; returns whether it did (not outside
        a flow run, nor when off)."""
        about = _about_this_run(run_name)
        if about is None or self.seconds <= 0 or self._thread is not None:
            return False
        self._about = about
        return self.restart()

    def restart(self) -> bool:
        """Pulse again after :meth:`stop` (a suspended run that went on at once)."""
        if self._about is None or self._thread is not None:
            return False
        self._stop.clear()
        # A copy of the context: the thread sends with the flow run's settings and client.
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=context.run, args=(self._beat,), name="prefect-coder-pulse", daemon=True
        )
        self._thread.start()
        return True

    def stop(self) -> None:
        """Stop pulsing and say so, so that the silence after is not taken for a death."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=self.seconds + 5)
        self._thread = None
        self._send(QUIET)

    def _beat(self) -> None:
        while not self._stop.is_set():
            self._send(PULSE)
            self._stop.wait(self.seconds)

    def _send(self, event: str) -> None:
        if self._about is None:
            return
        resource, related = self._about
        # A pulse missed is one of several: the next one goes.
        with contextlib.suppress(Exception):
            emit_event(event=event, resource=resource, related=related)


def _about_this_run(name: str) -> tuple[dict[str, str], list[dict[str, str]]] | None:
    """The event's resource (this flow run) and related resources (its flow by name, and
    its deployment), as Prefect's own heartbeat names them, so the same triggers match."""
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return None
    run: Any = context.flow_run
    resource = {
        "prefect.resource.id": f"prefect.flow-run.{run.id}",
        "prefect.resource.name": name,
    }
    related = [
        {
            "prefect.resource.id": f"prefect.flow.{run.flow_id}",
            "prefect.resource.role": "flow",
            "prefect.resource.name": context.flow.name if context.flow else "",
        }
    ]
    if run.deployment_id:
        related.append(
            {
                "prefect.resource.id": f"prefect.deployment.{run.deployment_id}",
                "prefect.resource.role": "deployment",
            }
        )
    return resource, related


async def heard_lately(client: PrefectClient, run_id: UUID) -> str | None:
    """What Prefect heard from a run lately, if anything: a run whose trigger fired for its
    silence may have spoken since (its events sent late, after Prefect's server was
    restarted or out of reach). A run that pulses is judged by its pulse (its heartbeat
    comes every 30 s anyway); one that never did, or said it stopped, by its heartbeat."""
    now = datetime.now(UTC)
    last = await _last(client, run_id, [PULSE, QUIET], since=None)
    if last is not None and last[0] == PULSE:
        age = (now - last[1]).total_seconds()
        return f"a pulse {max(age, 0):.0f} s ago" if age < PULSE_WINDOW else None
    beat = await _last(client, run_id, [HEARTBEAT], since=now - timedelta(seconds=HEARTBEAT_WINDOW))
    if beat is None:
        return None
    return f"a heartbeat {max((now - beat[1]).total_seconds(), 0):.0f} s ago"


async def _last(
    client: PrefectClient, run_id: UUID, names: list[str], since: datetime | None
) -> tuple[str, datetime] | None:
    """The latest of a run's events named ``names`` (since ``since``): its name and when."""
    wanted: dict[str, Any] = {
        "event": {"name": names},
        "resource": {"id": [f"prefect.flow-run.{run_id}"]},
    }
    if since is not None:
        wanted["occurred"] = {"since": since.isoformat()}
    response = await client.request("POST", "/events/filter", json={"filter": wanted, "limit": 1})
    response.raise_for_status()
    events = response.json()["events"]
    if not events:
        return None
    return events[0]["event"], datetime.fromisoformat(events[0]["occurred"])
