"""While a fleet runs, the garbage collector leaves alone the heap the process had before it.

A full collection walks every object the process holds, and a flow-run process holds
Prefect, pydantic and all they import. A fleet of 200 three-turn workflows sets off one
or two full collections a run, each stopping the event loop for 0.2 to 0.45 s, longer
as the process grows (``bench.fleet``'s "full GC" column): about a tenth of the run's
wall time, spent walking objects that were there before it began.

So the objects present when the first fleet of the process begins are frozen
(:func:`gc.freeze`): the collector skips them and walks only what the runs make. They
are thawed when the last fleet ends, so nothing is kept for good (a cycle that was
already garbage then is collected after). A process whose heap someone else froze (a
preforking server, say) is left as it is.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator


class _Freezer:
    """How many fleets hold the heap frozen, and whether we froze it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._ours = False

    def hold(self) -> None:
        with self._lock:
            if self._holders == 0:
                self._ours = gc.get_freeze_count() == 0
                if self._ours:
                    gc.freeze()
            self._holders += 1

    def release(self) -> None:
        with self._lock:
            self._holders -= 1
            if self._holders == 0 and self._ours:
                gc.unfreeze()
                self._ours = False


_FREEZER = _Freezer()


@contextlib.contextmanager
def heap_frozen() -> Iterator[None]:
    """Freeze the heap found here for the collector while the block runs (see the module)."""
    _FREEZER.hold()
    try:
        yield
    finally:
        _FREEZER.release()
