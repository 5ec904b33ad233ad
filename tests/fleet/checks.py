"""Every invariant of one played schedule, judged from its evidence."""

from __future__ import annotations

from .check_fencing import check_fencing
from .check_outcomes import (
    check_charges,
    check_finished,
    check_orphans,
    check_results,
    check_usage,
)
from .check_people import check_people
from .check_recovery import check_recovery
from .check_resends import check_resends
from .check_secrets import check_secrets
from .check_sweeps import check_sweeps
from .evidence import Evidence
from .verdicts import Findings

CHECKS = (
    check_finished,
    check_recovery,
    check_sweeps,
    check_charges,
    check_results,
    check_usage,
    check_resends,
    check_orphans,
    check_fencing,
    check_people,
    check_secrets,
)


def check_all(ev: Evidence) -> Findings:
    findings = Findings()
    for check in CHECKS:
        findings.merge(check(ev))
    return findings
