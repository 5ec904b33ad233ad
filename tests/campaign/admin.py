"""The simulator's admin routes (``/simulator/v1``) over HTTP, as another process uses them.

The campaign arms its fault knobs and holds sends through here rather than through
the in-process ``sim.faults``, so what it exercises is what a separate test
process can do to a running server.
"""

from __future__ import annotations

from typing import Any

import httpx

from tests.lab.steps import Knob

#: Knob kinds that are a configuration change rather than a fault rule.
CONFIG_KNOBS = {"deadline"}


class Admin:
    """A client of one simulator's admin routes."""

    def __init__(self, base_url: str, token: str) -> None:
        # A fresh connection per call. The admin calls come seconds apart, and a
        # pooled connection can be closed by the server's keep-alive timeout (5 s in
        # uvicorn) in the instant the next call is written on it: that call then fails
        # with a reset (httpx.ReadError), and a harness error hides the schedule.
        self._http = httpx.AsyncClient(
            base_url=f"{base_url}/simulator/v1",
            headers={"Coder-Session-Token": token},
            timeout=30,
            limits=httpx.Limits(max_keepalive_connections=0),
        )

    async def __aenter__(self) -> Admin:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._http.aclose()

    async def arm(self, knob: Knob) -> None:
        if knob.kind in CONFIG_KNOBS:
            await self._call("PATCH", "/config", knob.payload)
        else:
            await self._call("POST", f"/faults/{knob.kind}", knob.payload)

    async def script(self, when: str, then: str) -> None:
        """Answer every prompt containing ``when`` as if the directives ``then`` were in it."""
        await self._call("POST", "/scripts", {"when": when, "then": then})

    async def hold_send(self, chat_id: str) -> None:
        """Hold the chat's next send before it commits, until released or dropped."""
        body = {"route": "send_message", "phase": "before", "chat_id": chat_id}
        await self._call("POST", "/faults/hold", body)

    async def held(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = await self._call("GET", "/held")
        return found

    async def release(self, held_id: int) -> None:
        """Release a held request; one that is no longer held (a clear released it, or
        its client went away with its process) is left as it is."""
        response = await self._http.request("POST", f"/held/{held_id}/release")
        if response.status_code != 404:
            response.raise_for_status()

    async def clear(self) -> None:
        """Remove every fault rule and release whatever is still held."""
        await self._call("DELETE", "/faults")

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        response = await self._http.request(method, path, json=body)
        response.raise_for_status()
        return response.json()
