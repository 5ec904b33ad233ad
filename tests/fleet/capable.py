"""Whether this machine can hold a fleet lab, and if not, why.

A lab needs root (namespaces, veth pairs, routes), ``ip`` and ``tc`` from
iproute2, ``unshare``, and PostgreSQL's server binaries. Without them the CI
scenario skips and says which is missing, unless ``PREFECT_CODER_REQUIRE_NETNS=1``
(CI sets it): then a missing capability fails the run.
"""

from __future__ import annotations

import os
import shutil

from tests.pgcluster import PgClusterUnavailable, _bindir

REQUIRE = "PREFECT_CODER_REQUIRE_NETNS"


def missing() -> str | None:
    """What this machine lacks for a fleet lab, or ``None``."""
    if os.geteuid() != 0:
        return "the fleet lab needs root (network namespaces, veth pairs, routes)"
    for tool in ("ip", "tc", "unshare", "runuser"):
        if shutil.which(tool) is None:
            return f"the fleet lab needs `{tool}` (iproute2 / util-linux)"
    if not os.path.isdir("/proc/self/ns") or not os.path.exists("/proc/self/ns/net"):
        return "the fleet lab needs network namespaces (/proc/self/ns/net)"
    try:
        _bindir()
    except PgClusterUnavailable as exc:
        return f"the fleet lab needs PostgreSQL's server binaries: {exc}"
    return None


def required() -> bool:
    return os.environ.get(REQUIRE) == "1"
