"""Servers that tests start get ports outside the range outbound connections take theirs from
(see tests/ports.py): a port picked from it was taken by a connection before the server bound it."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.ports import LOWEST, free_port


def test_a_picked_port_is_below_the_ephemeral_range_and_free() -> None:
    first = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(20):
        port = free_port()
        assert LOWEST <= port < first
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))  # nothing holds it


def test_a_port_something_listens_on_is_never_picked() -> None:
    held = []
    try:
        for _ in range(200):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", free_port()))
            sock.listen()
            held.append(sock)
        ports = {s.getsockname()[1] for s in held}
        assert len(ports) == len(held)  # each pick was free when made, so none repeats
    finally:
        for sock in held:
            sock.close()
