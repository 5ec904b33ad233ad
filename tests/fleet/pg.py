"""A private PostgreSQL on one of the lab's hosts: :class:`~tests.pgcluster.PgCluster`,
run inside the host's namespace and listening on the host's address.

The store's server also keeps a CSV log of every statement with the address and
port that sent it (:mod:`.storelog` reads it back): who wrote what, and when,
is then known from the server's side, whatever the clients believed.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from tests.pgcluster import PgCluster

from .net import Host

PORT = 5432


class HostPg(PgCluster):
    """A PostgreSQL server in ``host``'s namespace, on ``listen`` (the host's address, or
    its loopback for a server only the host itself uses)."""

    def __init__(
        self, root: Path, host: Host, listen: str, *, statement_log: bool, for_prefect: bool = False
    ) -> None:
        root.mkdir(parents=True, exist_ok=True)
        super().__init__(root, for_prefect=for_prefect)
        self.host = host
        self.listen = listen
        self.port = PORT
        self.statement_log = statement_log
        # pg_ctl's readiness probe must reach the server where it listens: in the namespace.
        self.prefix = ["ip", "netns", "exec", host.ns]

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@{self.listen}:{self.port}/postgres"

    @property
    def log_folder(self) -> Path:
        return self.root / "statements"

    def _options(self) -> str:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses={self.listen} "
            "-c fsync=off -c full_page_writes=off -c max_connections=400"
        )
        if self.statement_log:
            options += (
                " -c logging_collector=on -c log_destination=csvlog"
                f" -c log_directory={self.log_folder} -c log_statement=all"
                " -c log_filename=statements-%Y%m%d-%H%M%S.log -c log_rotation_size=0"
            )
        return options

    def start(self) -> HostPg:
        if self._as_postgres:
            shutil.chown(self.root, "postgres")
        if not self.data.exists():
            self._create()
            # The lab's subnet is private to this machine: every host may connect.
            with (self.data / "pg_hba.conf").open("a") as hba:
                hba.write("host all all 10.231.0.0/16 trust\n")
        if self.statement_log:
            self.log_folder.mkdir(exist_ok=True)
            if self._as_postgres:
                shutil.chown(self.log_folder, "postgres")
        super().start()
        return self

    async def astart(self) -> HostPg:
        return await asyncio.to_thread(self.start)

    async def arestart(self) -> None:
        await asyncio.to_thread(self.restart)

    async def astop(self) -> None:
        await asyncio.to_thread(self.stop)
