"""Every request that reached Coder, from the front door's log, and who sent it.

A request that changes something on Coder (a chat created, a prompt sent, tool
results submitted, a run interrupted, a chat archived) is an *action*; reads are
not. Each is attributed to the flow run whose socket sent it (:mod:`.witness`),
or at least to the host whose address it came from.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from .witness import Witness

_CHAT = re.compile(r"/chats/([0-9a-f-]{36})")


@dataclass(frozen=True)
class Request:
    at: datetime
    src: str
    method: str
    path: str
    #: The flow run that sent it (empty when no glimpse of its socket was caught).
    flow_run_id: str
    host: str

    @property
    def chat_id(self) -> str | None:
        match = _CHAT.search(self.path)
        return match.group(1) if match else None

    @property
    def action(self) -> str | None:
        """What the request does to Coder, or ``None`` for a read."""
        if self.method == "POST" and self.path.rstrip("/").endswith("/chats"):
            return "create"
        if self.method == "POST" and self.path.endswith("/messages"):
            return "send"
        if self.method == "POST" and self.path.endswith("/tool-results"):
            return "submit"
        if self.method == "POST" and self.path.endswith("/interrupt"):
            return "interrupt"
        if self.method == "PATCH" and self.chat_id:
            return "archive"
        return None

    def describe(self) -> str:
        who = self.flow_run_id or f"an unattributed socket of {self.host or self.src}"
        return f"{self.at:%H:%M:%S.%f} {self.method} {self.path} from {who}"


def read_requests(path: Path, witness: Witness) -> list[Request]:
    found = []
    for line in path.read_text(errors="replace").splitlines():
        with_fields = json.loads(line)
        at = float(with_fields["at"])
        src = str(with_fields["src"])
        sighting = witness.who(src, at)
        host = witness.host_of(src.rpartition(":")[0]) or ""
        found.append(
            Request(
                datetime.fromtimestamp(at, UTC),
                src,
                str(with_fields["method"]),
                str(with_fields["path"]),
                sighting.flow_run_id if sighting else "",
                host,
            )
        )
    return found
