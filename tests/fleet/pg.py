"""A private PostgreSQL on one of the lab's hosts: :class:`~tests.pgcluster.PgCluster`,
run inside the host's namespace and listening on the host's address.

It lets in one role, with a password, to one database: the service's own login
(:class:`Setup`), made when the server is first created, with no more rights than the
service needs (see :func:`ledger_grants` and :func:`prefect_grants`). Nothing else may
connect over the network; the lab's own administration goes through the server's socket,
as the ``postgres`` user. A server may also require TLS, with a certificate made for its
address, which its clients verify.

The store's server also keeps a CSV log of every statement with the address and
port that sent it (:mod:`.storelog` reads it back): who wrote what, and when,
is then known from the server's side, whatever the clients believed.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode

from tests.pgcluster import PgCluster

from .net import Host

PORT = 5432


@dataclass(frozen=True)
class Setup:
    """How a host's server is set up: where it listens, the one role it lets in over the
    network (to its one database, from ``network``, a CIDR), and what else it does."""

    listen: str
    role: str
    database: str
    network: str
    #: (database, SQL) run by the administrator once the role exists: its rights.
    grants: tuple[tuple[str, str], ...]
    statement_log: bool = False
    tls: bool = False
    #: Its data starts as a copy of Prefect's migrated tables.
    for_prefect: bool = False
    password: str = field(default_factory=lambda: secrets.token_urlsafe(18), repr=False)


def ledger_grants(database: str, schema: str, role: str) -> tuple[tuple[str, str], ...]:
    """The store's role owns its schema, in a database of its own, and nothing else."""
    return (
        (
            "postgres",
            f"CREATE DATABASE {database};\n"
            f"REVOKE ALL ON DATABASE {database}, postgres FROM PUBLIC;\n"
            f"GRANT CONNECT ON DATABASE {database} TO {role};",
        ),
        (
            database,
            "REVOKE ALL ON SCHEMA public FROM PUBLIC;\n"
            f"CREATE SCHEMA {schema} AUTHORIZATION {role};",
        ),
    )


def prefect_grants(role: str) -> tuple[tuple[str, str], ...]:
    """Prefect's role uses the tables its migrations made (they came ready, as the
    administrator's: :func:`~tests.pgcluster.prefect_ready_data`), and may add its own."""
    return (
        (
            "postgres",
            f"GRANT USAGE, CREATE ON SCHEMA public TO {role};\n"
            f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role};\n"
            f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role};",
        ),
    )


class HostPg(PgCluster):
    """A PostgreSQL server in ``host``'s namespace, set up as ``setup`` says."""

    def __init__(self, root: Path, host: Host, setup: Setup) -> None:
        root.mkdir(parents=True, exist_ok=True)
        super().__init__(root, for_prefect=setup.for_prefect)
        self.host = host
        self.setup = setup
        self.listen = setup.listen
        self.port = PORT
        self.tls = setup.tls
        self.statement_log = setup.statement_log
        #: The statement log's folder (:mod:`.storelog`), and the certificate clients verify.
        self.log_folder = root / "statements"
        self.certificate = root / "server.crt"
        # pg_ctl's readiness probe must reach the server where it listens: in the namespace.
        self.prefix = ["ip", "netns", "exec", host.ns]

    @property
    def dsn(self) -> str:
        """How the service connects: its role and password, and TLS verified if required."""
        setup = self.setup
        dsn = f"postgresql://{setup.role}:{setup.password}@{self.listen}:{self.port}/"
        query = {"sslmode": "verify-full", "sslrootcert": str(self.certificate)}
        return dsn + setup.database + (f"?{urlencode(query)}" if self.tls else "")

    def _options(self) -> str:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses={self.listen} "
            "-c fsync=off -c full_page_writes=off -c max_connections=400"
        )
        if self.tls:
            key = self.root / "server.key"
            options += f" -c ssl=on -c ssl_cert_file={self.certificate} -c ssl_key_file={key}"
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
        new = not self.data.exists()
        if new:
            self._create()
            self._write_hba()
            if self.tls:
                self._make_certificate()
        if self.statement_log:
            self.log_folder.mkdir(exist_ok=True)
            if self._as_postgres:
                shutil.chown(self.log_folder, "postgres")
        super().start()
        if new:
            self._provision()
        return self

    def _write_hba(self) -> None:
        """The administrator through the socket, as the ``postgres`` user; the service's
        role from the lab's subnet with its password (over TLS if required); no one else."""
        kind = "hostssl" if self.tls else "host"
        setup = self.setup
        (self.data / "pg_hba.conf").write_text(
            "local all postgres peer\n"
            f"{kind} {setup.database} {setup.role} {setup.network} scram-sha-256\n"
        )

    def _make_certificate(self) -> None:
        """A self-signed certificate for the server's address: what the clients verify."""
        key = self.root / "server.key"
        command = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3"]
        command += ["-subj", f"/CN={self.host.name}", "-addext", f"subjectAltName=IP:{self.listen}"]
        command += ["-keyout", str(key), "-out", str(self.certificate)]
        subprocess.run(command, check=True, capture_output=True, timeout=60)
        key.chmod(0o600)
        if self._as_postgres:
            for path in (key, self.certificate):
                shutil.chown(path, "postgres")
        self.certificate.chmod(0o644)

    def _provision(self) -> None:
        setup = self.setup
        self.admin_sql(f"CREATE ROLE {setup.role} LOGIN PASSWORD '{setup.password}';")
        for database, sql in setup.grants:
            self.admin_sql(sql, database)

    async def astart(self) -> HostPg:
        return await asyncio.to_thread(self.start)

    async def arestart(self) -> None:
        await asyncio.to_thread(self.restart)

    async def astop(self) -> None:
        await asyncio.to_thread(self.stop)

    async def adump(self, database: str) -> bytes:
        return await asyncio.to_thread(self.dump, database)
