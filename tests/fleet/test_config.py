"""The lab's limits agree with one another, or the recovery check judges a bound the
product was never given (schedule 15/87: a sweep pass lost with its host kept its
lease past the next pass due, and recovery took a whole extra interval)."""

from __future__ import annotations

import pytest

from .config import Timings


def test_the_sweep_is_given_a_lease_shorter_than_its_interval() -> None:
    timings = Timings()
    lease = timings.sweep_parameters()["lease_seconds"]
    assert isinstance(lease, float)
    assert lease + timings.heartbeat < timings.sweep_interval


def test_a_lease_outlasting_the_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="sweep_lease"):
        Timings(sweep_interval=20, sweep_lease=30.0)
