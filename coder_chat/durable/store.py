"""The store every durable backend is (SQLite, Postgres): :class:`DurableStore`.

Writes are durable when they return (committed, synced). Writes that act for a
workflow run take its :class:`Fence` and succeed only while that run still holds
the workflow's newest epoch; otherwise they raise :class:`FencedOut`, so a run
that wakes after being superseded can never act.

Each store has an id (:meth:`DurableStore.store_id`), made once when the store is
created and the same for every process that opens it: chats are labelled with it,
so a sweep acts only on the chats of its own store.
"""

from .base import DurableStore
from .records import SCHEMA_VERSION, FencedOut

__all__ = ["SCHEMA_VERSION", "DurableStore", "FencedOut"]
