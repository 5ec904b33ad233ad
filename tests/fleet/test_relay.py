"""The front door's request-head parser, on byte streams split anywhere."""

from __future__ import annotations

from tests.fleet.relay import RequestHeads

GET = b"GET /api/v2/chats/1 HTTP/1.1\r\nHost: coder\r\n\r\n"
POST = b'POST /api/v2/chats/1/messages HTTP/1.1\r\nContent-Length: 11\r\n\r\n{"a": "b"}\n'
CHUNKED = (
    b"POST /api/v2/chats HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n"
)
UPGRADE = (
    b"GET /api/v2/chats/1/stream HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
)


def heads_of(stream: bytes, size: int) -> list[tuple[str, str, bool]]:
    parser, heads = RequestHeads(), []
    for start in range(0, len(stream), size):
        heads += parser.feed(stream[start : start + size])
    return heads


def test_requests_on_one_connection_are_found_however_the_bytes_are_split() -> None:
    stream = GET + POST + CHUNKED + GET
    expected = [
        ("GET", "/api/v2/chats/1", False),
        ("POST", "/api/v2/chats/1/messages", False),
        ("POST", "/api/v2/chats", False),
        ("GET", "/api/v2/chats/1", False),
    ]
    for size in (1, 2, 3, 7, 64, len(stream)):
        assert heads_of(stream, size) == expected, size


def test_a_body_that_looks_like_a_request_is_not_one() -> None:
    body = GET
    post = b"POST /x HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    assert heads_of(post + GET, 5) == [("POST", "/x", False), ("GET", "/api/v2/chats/1", False)]


def test_a_websocket_upgrade_makes_the_rest_opaque() -> None:
    frames = b"\x81\x05hello" + GET
    assert heads_of(UPGRADE + frames, 4) == [("GET", "/api/v2/chats/1/stream", True)]
