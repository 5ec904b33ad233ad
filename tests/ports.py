"""A port for a server that a test or a lab starts: free when picked, and outside the range
the kernel hands out to outbound connections.

Binding to port 0 gets a port from the kernel's ephemeral range (``ip_local_port_range``,
32768-60999 by default), the range every outbound connection of the machine takes its local
port from. Picked that way, released, then given to a server to bind, it may be taken by a
connection meanwhile: a CI run's ``prefect server start`` failed "address already in use",
with five test processes and their servers, databases and clients connecting all around it.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: The lowest port picked: above the well-known and the commonly configured ones.
LOWEST = 20000
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port() -> int:
    """A port nothing listens on now, below the ephemeral range (chosen at random, so that
    processes picking at once rarely pick the same)."""
    highest = _ephemeral_start() - 1
    if highest <= LOWEST:  # an unusual machine: the kernel's own choice, as before
        return _kernel_port()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randint(LOWEST, highest)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return _kernel_port()


def _ephemeral_start() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _kernel_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
