"""Prefect blocks: the Coder connection and the durable store, saved in Prefect.

Register them with ``prefect block register -m prefect_coder.blocks`` (a server running in the
same environment registers them by itself through the ``prefect.collections``
entry point).
"""

from prefect_coder.blocks.credentials import CoderCredentials
from prefect_coder.blocks.ledger import PostgresLedger, SqliteLedger

__version__ = "0.1.0"
__all__ = ["CoderCredentials", "PostgresLedger", "SqliteLedger"]
