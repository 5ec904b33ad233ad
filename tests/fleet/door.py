"""Prefect's front door: what a client on a worker host gets from the API without the
auth string, and with it.

The fleet's server asks every client for its basic authentication. Anyone else on the
network reaches its port; they must read nothing: no block (the Coder credentials'
token is returned to whoever asks for it with its secrets), no flow run. The knock is
sent from a worker host, by a process given the API's address and nothing more, with
plain HTTP (no Prefect client, whose settings could bring the auth string along).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from prefect.client.orchestration import get_client

from tests.integration.procs import clean_env

from .config import CREDENTIALS_SLUG, PYTHON, ROOT
from .fleet import Fleet

CREDENTIALS_TYPE = CREDENTIALS_SLUG.split("/")[0]
#: Run on a worker host: argv is the API's address and the credentials block's id; the
#: environment may give ``KNOCK_AUTH``. Prints each ask's HTTP status, as JSON.
KNOCK = """
import base64, json, os, sys
import httpx
api, block = sys.argv[1], sys.argv[2]
auth = os.environ.get("KNOCK_AUTH")
headers = {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()} if auth else {}
asks = {
    "list the blocks": ("POST", "/block_documents/filter", {}),
    "read the Coder credentials with their secrets": (
        "GET", f"/block_documents/{block}?include_secrets=true", None),
    "list the flow runs": ("POST", "/flow_runs/filter", {}),
    "read the API's settings": ("GET", "/admin/settings", None),
}
with httpx.Client(base_url=api, headers=headers, timeout=60) as client:
    answers = {name: client.request(m, path, json=body).status_code
               for name, (m, path, body) in asks.items()}
print("knock: " + json.dumps(answers))
"""


@dataclass(frozen=True)
class Door:
    """Each ask's HTTP status, without the auth string and with it."""

    without: dict[str, int]
    with_auth: dict[str, int]

    @property
    def shut(self) -> bool:
        """Nothing answered without the auth string, everything with it."""
        return set(self.without.values()) == {401} and set(self.with_auth.values()) == {200}

    def describe(self) -> str:
        return f"without the auth string: {self.without}; with it: {self.with_auth}"


async def knock(fleet: Fleet) -> Door:
    """Knock on Prefect's API from the first worker host, without the auth string and with it."""
    async with get_client() as client:
        document = await client.read_block_document_by_name("fleet", CREDENTIALS_TYPE)
    block = str(document.id)
    return Door(await _knock(fleet, block, None), await _knock(fleet, block, fleet.auth_string))


async def _knock(fleet: Fleet, block: str, auth: str | None) -> dict[str, int]:
    host = fleet.worker_hosts[0]
    env = {**clean_env(), **({"KNOCK_AUTH": auth} if auth else {})}
    argv = host.exec(PYTHON, "-c", KNOCK, fleet.api_url, block)
    output = await fleet.procs.run(f"knock-{host.name}", *argv, env=env, cwd=ROOT, timeout=120)
    [line] = [x for x in output.splitlines() if x.startswith("knock: ")]
    answers: dict[str, int] = json.loads(line.removeprefix("knock: "))
    return answers
