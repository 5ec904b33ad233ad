"""Everything the checks judge a played schedule by, gathered once it is quiet.

From the peers' own records: the simulator's chats and accepted actions, the
front door's request log, the store's committed writes and rows, Prefect's flow
runs, the payments fake's applied charges; plus what the lab itself saw (the
faults it played, the witness's sightings of flow runs on hosts).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta

from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun

from coder_chat.durable.records import LedgerEntry, StepRecord, WorkflowRecord
from coder_chat.durable.store import DurableStore

from .coder_requests import Request, read_requests
from .config import Timings
from .door import Door
from .fleet import Fleet
from .leaks import token_leaks
from .play import Played
from .runs import deployment_runs, run_logs, runs_of
from .storelog import Write, read_writes
from .truth import Truth, read_truth
from .witness import Witness


@dataclass
class Evidence:
    played: Played
    timings: Timings
    tenant: str
    truth: Truth
    requests: list[Request]
    writes: list[Write]
    #: Per workflow: its ``durable-chat`` flow runs, oldest first.
    runs: dict[str, list[FlowRun]]
    sweeps: list[FlowRun]
    workflows: dict[str, WorkflowRecord | None]
    steps: dict[str, list[StepRecord]]
    #: Per chat of the schedule's workflows: its tool ledger.
    ledger: dict[str, list[LedgerEntry]]
    applied: dict[str, int]
    receipts: dict[str, str]
    witness: Witness
    #: Each of those runs' log lines, as the API keeps them (a killed run's may be missing).
    logs: dict[str, list[str]]
    #: Flow run id -> the worker host that submitted it (from the workers' own logs).
    submitted: dict[str, str]
    #: Where the Coder token was found on our side of the fleet (:mod:`.leaks`).
    token_found: list[str]
    #: What Prefect's API answered a client without its auth string, and one with it.
    door: Door | None

    @property
    def workflow_ids(self) -> list[str]:
        return [w.workflow_id for w in self.played.schedule.workflows]

    def run_name(self, flow_run_id: str) -> str:
        for runs in self.runs.values():
            for run in runs:
                if str(run.id) == flow_run_id:
                    return run.name
        return flow_run_id

    def host_of(self, flow_run_id: str) -> str:
        """Where the run's processes were seen, else which worker submitted it."""
        seen = self.witness.runs.get(flow_run_id)
        return seen.host if seen else self.submitted.get(flow_run_id, "?")


async def gather(fleet: Fleet, played: Played, store: DurableStore) -> Evidence:
    coder, witness = fleet.coder, fleet.witness
    assert coder is not None and witness is not None
    tenant, ids = coder.organization_id, [w.workflow_id for w in played.schedule.workflows]
    truth = await read_truth(coder.url, coder.token)
    async with get_client() as client:
        since = played.started - timedelta(minutes=1)
        durable = await deployment_runs(client, "durable-chat", since)
        sweeps = await deployment_runs(client, "orphan-sweep", since)
        ours = [r for i in ids for r in runs_of(durable, i)]
        logs = {str(r.id): await run_logs(client, r.id) for r in ours}
    chats = [c.id for i in ids for c in truth.workflow_chats(i)]
    return Evidence(
        played=played,
        timings=fleet.timings,
        tenant=tenant,
        truth=truth,
        requests=read_requests(coder.requests_log, witness),
        writes=read_writes(fleet.store_pg.log_folder),
        runs={i: runs_of(durable, i) for i in ids},
        sweeps=sweeps,
        workflows={i: await store.get_workflow(tenant, i) for i in ids},
        steps={i: await store.list_steps(tenant, i) for i in ids},
        ledger={c: await store.list_tools(tenant, c) for c in chats},
        applied=dict(fleet.payments.applied),
        receipts=dict(fleet.payments.receipts),
        witness=witness,
        logs=logs,
        submitted=submissions(fleet),
        token_found=await token_leaks(fleet),
        door=fleet.door,
    )


def submissions(fleet: Fleet) -> dict[str, str]:
    """Which worker host submitted each flow run, from every worker's log (a killed
    host's old worker included)."""
    found: dict[str, str] = {}
    for proc in fleet.procs.started:
        if proc.name.startswith("worker-"):
            host = proc.name.removeprefix("worker-")
            for run_id in re.findall(r"submitting flow run '([0-9a-f-]+)'", proc.output()):
                found.setdefault(run_id, host)
    return found
