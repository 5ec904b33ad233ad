"""A crash-test child: one flow run with ``params``, in a process the fork server made
(tests/lab/forkserver.py) with everything already imported.

The flow is ``params["flow"]`` as ``module:function`` (for instance
``prefect_coder.examples.refund:refund_order``), ``durable_chat`` when absent; every
other parameter goes to it. Everything else comes from the environment the test
hands it (the simulator's ``CODER_*`` variables, ``PREFECT_CODER_SQLITE_PATH``,
``PAYMENTS_URL``, the shared ``PREFECT_API_URL`` and ``PREFECT_HOME``). The child
prints :data:`READY`, then waits for :data:`GO` (a signal), so a test can have the
process that will rerun a workflow ready before it crashes the one running it;
:data:`NOT_NEEDED` ends it instead. On success it prints one line,
:data:`RESULT_PREFIX` followed by what the flow returned as JSON (``durable_chat``:
its step results); a test that crashes it kills it (SIGKILL, its whole process
group) long before that.
"""

from __future__ import annotations

import asyncio
import json
import signal
from typing import Any

RESULT_PREFIX = "CRASH-CHILD-RESULTS "
READY = "CRASH-CHILD-READY"
#: Run the flow now.
GO = signal.SIGUSR1
#: The test ended without needing this child: exit 0.
NOT_NEEDED = signal.SIGUSR2
SIGNALS = (GO, NOT_NEEDED)
#: The flow a child runs when its parameters name none.
DURABLE_CHAT = "prefect_coder.flows.durable_chat:durable_chat"


def flow_path(params: dict[str, Any]) -> str:
    return str(params.get("flow") or DURABLE_CHAT)


def load_flow(path: str) -> Any:
    """The flow object at ``module:function`` (imported: the slow part)."""
    from prefect import Flow
    from prefect.utilities.importtools import import_object

    found = import_object(path)
    if not isinstance(found, Flow):
        raise TypeError(f"{path} is not a Prefect flow")
    return found


async def run(params: dict[str, Any]) -> Any:
    from pydantic_core import to_jsonable_python

    flow = load_flow(flow_path(params))
    rest = {k: v for k, v in params.items() if k != "flow"}
    returned = await flow(**await flow_params(flow, rest))
    return to_jsonable_python(returned)


async def flow_params(flow: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Tests write the settings' fields beside the others (for a flow that takes
    ``settings``) and a ledger as a saved block's ``slug/name``: here they become
    ``settings`` and the loaded block."""
    from prefect.blocks.core import Block

    from prefect_coder.settings import WorkflowSettings

    flat = dict(params)
    if "settings" in flow.parameters.properties:
        fields = WorkflowSettings.model_fields
        flat = {k: v for k, v in params.items() if k not in fields}
        flat["settings"] = {k: v for k, v in params.items() if k in fields}
    if isinstance(flat.get("ledger"), str):
        flat["ledger"] = await Block.aload(flat["ledger"])
    return flat


def main(params: dict[str, Any]) -> int:
    """The child's life; :data:`SIGNALS` are blocked (the fork server blocked them)."""
    load_flow(flow_path(params))  # imported already, unless the server did not preload it
    print(READY, flush=True)
    if signal.sigwait(SIGNALS) != GO:
        return 0
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
    returned = asyncio.run(run(params))
    print(RESULT_PREFIX + json.dumps(returned), flush=True)
    return 0
