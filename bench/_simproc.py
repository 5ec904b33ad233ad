"""Start ``prefect-coder simulator`` as a separate process, so a benchmark's client
and the server do not share one event loop (the machine has two cores)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class SimProcess:
    base_url: str
    token: str
    organization_id: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Coder-Session-Token": self.token}


@contextmanager
def simulator_process(*extra: str) -> Iterator[SimProcess]:
    exe = os.path.join(os.path.dirname(sys.executable), "prefect-coder")
    proc = subprocess.Popen(
        [exe, "simulator", "--port", "0", "--delta-interval", "0", *extra],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        # Three `export NAME='value'` lines, read back as a shell would.
        lines = dict(shlex.split(proc.stdout.readline())[1].split("=", 1) for _ in range(3))
        yield SimProcess(lines["CODER_URL"], lines["CODER_SESSION_TOKEN"], lines["CODER_ORG_ID"])
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
