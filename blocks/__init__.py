"""Prefect blocks: the Coder connection and the durable store, saved in Prefect.

Register them with ``prefect block register -m blocks`` (a server running in the
same environment registers them by itself through the ``prefect.collections``
entry point).
"""

from .credentials import CoderCredentials
from .ledger import PostgresLedger, SqliteLedger

__version__ = "0.1.0"
__all__ = ["CoderCredentials", "PostgresLedger", "SqliteLedger"]
