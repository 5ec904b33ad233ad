"""The demo's worker process: runs ``durable_chat`` with the parameters given as JSON."""

from __future__ import annotations

import asyncio
import json
import sys


def main() -> None:
    from prefect_coder.flows.durable_chat import durable_chat

    params = json.loads(sys.argv[1])
    results = asyncio.run(durable_chat(**params))
    print("RESULTS " + json.dumps([r.model_dump(mode="json") for r in results]), flush=True)


if __name__ == "__main__":
    main()
