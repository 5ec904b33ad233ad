"""A private PostgreSQL server for tests that restart it: its own data folder and port.

The machine's shared server (127.0.0.1:5432) serves every other test; restarting it
would break whatever else runs at the time. A :class:`PgCluster` is ours alone:
``initdb`` into a temporary folder, ``pg_ctl start`` on a free loopback port, and
``restart()`` whenever a test wants the server to go away and come back. As root
(CI here runs as root) the server runs as the ``postgres`` user, since Postgres
refuses to run as root. It takes about a second to create and 0.2 s to restart.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path


class PgClusterUnavailable(RuntimeError):
    """No PostgreSQL server binaries on this machine (or no way to run them)."""


def _bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("pg_ctl")
    if on_path:
        return Path(on_path).parent
    raise PgClusterUnavailable("pg_ctl not found (install the PostgreSQL server package)")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class PgCluster:
    """One throwaway PostgreSQL server. ``start()``, ``restart()``, ``stop()``, ``dsn``."""

    def __init__(self, root: Path | None = None) -> None:
        self.bindir = _bindir()
        self.root = Path(root or tempfile.mkdtemp(prefix="prefect-coder-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self._as_postgres = os.geteuid() == 0
        #: What every command is run under (e.g. ``ip netns exec NS`` for a server in a
        #: network namespace of its own).
        self.prefix: list[str] = []

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        command = [*self.prefix, *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise PgClusterUnavailable(
                f"{args[0]} failed ({result.returncode}): {result.stderr.strip()[-500:]}"
            )

    def _options(self) -> str:
        # Loopback only, its own socket folder, and no fsync: these servers hold test data.
        return (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c full_page_writes=off"
        )

    def start(self) -> PgCluster:
        if self._as_postgres:
            shutil.chown(self.root, "postgres")
        if not self.data.exists():
            self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-o",
            self._options(),
            "-l",
            str(self.log),
            "-w",
            "start",
        )
        return self

    @property
    def log(self) -> Path:
        return self.root / "server.log"

    def restart(self) -> None:
        """Stop at once (every connection dies, as in a crash), then start again."""
        self.stop()
        self.start()

    def stop(self) -> None:
        """Stop the server at once (the data stays until :meth:`destroy`).

        On a loaded machine ``pg_ctl stop`` has been seen to wait out its whole
        timeout; then the server's processes are killed outright, which is what an
        immediate stop amounts to anyway.
        """
        pidfile = self.data / "postmaster.pid"
        if not pidfile.exists():
            return
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-t", "20", "-w", "stop")
        except (PgClusterUnavailable, subprocess.TimeoutExpired):
            self._kill(pidfile)

    def _kill(self, pidfile: Path) -> None:
        with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
            pid = int(pidfile.read_text().split()[0])
            subprocess.run(["pkill", "-KILL", "-P", str(pid)], check=False)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.05)
        pidfile.unlink(missing_ok=True)

    def destroy(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PgCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.destroy()
