"""No WebSocket of the simulator negotiates compression, as coderd accepts its chat
streams with compression disabled, even when the client offers permessage-deflate."""

from __future__ import annotations

from collections.abc import Iterable

import websockets
from starlette.routing import BaseRoute, Mount, WebSocketRoute

from coder_chat.simulator import Simulator
from coder_chat.simulator.server import build_app

from .wire import Wire


def websocket_paths(routes: Iterable[BaseRoute]) -> list[str]:
    """Every WebSocket route's path template, mounted ones included."""
    paths: list[str] = []
    for route in routes:
        if isinstance(route, WebSocketRoute):
            paths.append(route.path)
        elif isinstance(route, Mount):
            paths += [route.path + p for p in websocket_paths(route.routes)]
    return paths


def served_websocket_paths(sim: Simulator) -> list[str]:
    # Read from the app itself, so a WebSocket route added later is checked too.
    return websocket_paths(build_app(sim.engine, lambda client: None).routes)


async def test_no_websocket_negotiates_compression(sim: Simulator) -> None:
    templates = served_websocket_paths(sim)
    assert len(templates) == 4  # stream and watch, under both prefixes
    negotiated: dict[str, str] = {}
    async with Wire(sim) as wire:
        chat = await wire.create("hello")
        for template in templates:
            url = wire.ws_url(template.format(chat=chat["id"]))
            async with websockets.connect(
                url, additional_headers=wire.headers, compression="deflate"
            ) as ws:
                assert ws.request is not None and ws.response is not None
                assert "permessage-deflate" in ws.request.headers["Sec-WebSocket-Extensions"]
                accepted = ws.response.headers.get("Sec-WebSocket-Extensions")
                if accepted is not None or ws.protocol.extensions:
                    negotiated[template] = str(accepted)
    assert negotiated == {}
