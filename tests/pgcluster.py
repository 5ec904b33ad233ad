"""A private PostgreSQL server for tests that restart it: its own data folder and port.

The machine's shared server (127.0.0.1:5432) serves every other test; restarting it
would break whatever else runs at the time. A :class:`PgCluster` is ours alone:
``initdb`` into a temporary folder, ``pg_ctl start`` on a free loopback port, and
``restart()`` whenever a test wants the server to go away and come back. As root
(CI here runs as root) the server runs as the ``postgres`` user, since Postgres
refuses to run as root. It takes about a second to create and 0.2 s to restart.

A cluster made ``for_prefect`` is a copy of one whose ``postgres`` database already holds
Prefect's tables (:func:`prefect_ready_data`): a ``prefect server`` started on it skips
its migrations, seconds of every server start (more on a loaded machine).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import prefect

from tests.ports import free_port


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


class PgCluster:
    """One throwaway PostgreSQL server. ``start()``, ``restart()``, ``stop()``, ``dsn``."""

    def __init__(self, root: Path | None = None, *, for_prefect: bool = False) -> None:
        self.for_prefect = for_prefect
        self.bindir = _bindir()
        self.root = Path(root or tempfile.mkdtemp(prefix="prefect-coder-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self._as_postgres = os.geteuid() == 0
        #: What every command is run under (e.g. ``ip netns exec NS`` for a server in a
        #: network namespace of its own).
        self.prefix: list[str] = []

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, stdin: str | None = None) -> bytes:
        """One of the server's programs, as its owner; its output."""
        command = [str(self.bindir / args[0]), *args[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        command = [*self.prefix, *command]
        result = subprocess.run(
            command, capture_output=True, input=stdin.encode() if stdin else None, timeout=120
        )
        if result.returncode != 0:
            stderr = result.stderr.decode(errors="replace").strip()[-500:]
            raise PgClusterUnavailable(f"{args[0]} failed ({result.returncode}): {stderr}")
        return result.stdout

    def admin_sql(self, sql: str, database: str = "postgres") -> str:
        """``sql`` run by the server's administrator, through its socket (given on stdin:
        a password in it is in no process's arguments)."""
        socket = ["-h", str(self.root), "-p", str(self.port), "-U", "postgres", "-d", database]
        out = self._run("psql", *socket, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", stdin=sql)
        return out.decode()

    def dump(self, database: str) -> bytes:
        """Every row of ``database``, as ``pg_dump`` writes it (for searches, not restores)."""
        socket = ["-h", str(self.root), "-p", str(self.port), "-U", "postgres"]
        return self._run("pg_dump", *socket, "--data-only", database)

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
            self._create()
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

    def _create(self) -> None:
        """``initdb``; or, for Prefect, a copy of a data folder its migrations ran on."""
        if self.for_prefect:
            # cp -a keeps the postgres user's ownership and the folder's 0700.
            subprocess.run(["cp", "-a", str(prefect_ready_data()), str(self.data)], check=True)
        else:
            self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")

    def require_passwords(self, administrator: str = "postgres") -> None:
        """From now on every role but ``administrator`` gives its password to connect over
        TCP (as a server set up for a fleet would); the administrator is let in as before."""
        (self.data / "pg_hba.conf").write_text(
            "local all all trust\n"
            f"host all {administrator} 127.0.0.1/32 trust\n"
            "host all all 127.0.0.1/32 scram-sha-256\n"
        )
        self._run("pg_ctl", "-D", str(self.data), "reload")

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


def prefect_ready_data() -> Path:
    """A stopped cluster's data folder whose ``postgres`` database Prefect's migrations (this
    environment's Prefect) have run on. Made once per temporary folder and Prefect version,
    under a lock, so that a test session's workers and the labs' children share it; CI's
    temporary folder goes at the end of the run, elsewhere it stays as a cache (about 40 MB)."""
    home = Path(tempfile.gettempdir()) / f"prefect-coder-pg-prefect-{prefect.__version__}"
    with locked(home.with_suffix(".lock")):
        if not (home / "ready").exists():
            shutil.rmtree(home, ignore_errors=True)
            home.mkdir()
            cluster = PgCluster(home).start()
            try:
                _migrate(cluster.dsn, home)
            finally:
                cluster.stop()
            (home / "ready").touch()
    return home / "data"


def _migrate(dsn: str, home: Path) -> None:
    env = {
        **os.environ,
        "PREFECT_HOME": str(home / "prefect-home"),
        "PREFECT_API_DATABASE_CONNECTION_URL": dsn.replace(
            "postgresql://", "postgresql+asyncpg://"
        ),
    }
    prefect_cli = Path(sys.executable).parent / "prefect"
    command = [str(prefect_cli), "server", "database", "upgrade", "-y"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise PgClusterUnavailable(f"Prefect's migrations failed: {result.stderr[-500:]}")


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Held by this process alone (others, this machine's, wait) until the block ends."""
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
