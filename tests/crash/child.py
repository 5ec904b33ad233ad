"""A crash-test child: ``python -m tests.crash.child '<json>'`` runs ``durable_chat(**params)``.

Everything else comes from the environment the test hands it (the simulator's
``CODER_*`` variables, ``PREFECT_CODER_SQLITE_PATH``, ``PAYMENTS_URL``, the shared
``PREFECT_API_URL`` and ``PREFECT_HOME``). The child imports everything first,
then prints :data:`READY` and waits for a ``go`` line on stdin, so a test can
start the process that will rerun a workflow before it crashes the one running
it (Python and Prefect take seconds to import). On success it prints one line,
:data:`RESULT_PREFIX` followed by the step results as JSON; a test that crashes
it kills it (SIGKILL, its whole process group) long before that.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

RESULT_PREFIX = "CRASH-CHILD-RESULTS "
READY = "CRASH-CHILD-READY"
GO = "go"


async def run(params: dict[str, Any]) -> list[dict[str, Any]]:
    from prefect_coder.flows.durable_chat import durable_chat

    results = await durable_chat(**await flow_params(params))
    return [r.model_dump(mode="json") for r in results]


async def flow_params(params: dict[str, Any]) -> dict[str, Any]:
    """Tests write the settings' fields beside the others and a ledger as a saved
    block's ``slug/name``: here they become ``settings`` and the loaded block."""
    from prefect.blocks.core import Block

    from prefect_coder.tasks.settings import WorkflowSettings

    fields = WorkflowSettings.model_fields
    flat = {k: v for k, v in params.items() if k not in fields}
    flat["settings"] = {k: v for k, v in params.items() if k in fields}
    if isinstance(flat.get("ledger"), str):
        flat["ledger"] = await Block.aload(flat["ledger"])
    return flat


def main(argv: list[str]) -> int:
    params = json.loads(argv[1])
    import prefect_coder.flows.durable_chat  # noqa: F401 - the slow part, done before the signal

    print(READY, flush=True)
    if sys.stdin.readline().strip() != GO:
        return 0  # the test ended without needing this child
    results = asyncio.run(run(params))
    print(RESULT_PREFIX + json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
