"""The fleet lab (issue 16): Prefect workers on several hosts, faults on hosts and links.

Every host is a Linux network namespace with its own address on one bridge
(veth pairs), its own processes and its own files:

- **control**: ``prefect server start`` on a private PostgreSQL, with the
  ``orphan-sweep`` deployment scheduled every few seconds;
- **coder**: ``prefect-coder simulator``, behind a front door (:mod:`.relay`)
  that logs which address called what, when;
- **store**: a private PostgreSQL for the ``PostgresLedger`` block, logging every
  statement with the address that sent it;
- **w1..w3**: ``prefect worker start --pool coder-agents``, each with its own
  ``PREFECT_HOME`` and result storage.

The lab itself (this process) sits on the bridge's own address, where it serves
the payments fake that the workflows' ``charge_card`` tool charges. Faults are
drawn from a seed (:mod:`.draw`): a worker host SIGKILLed whole, cut off and
healed, cut off from the store or from Coder alone, its link to Coder shaped,
the store's PostgreSQL or Prefect's server restarted. The invariants
(:mod:`.checks`) are read from the peers' own records: the simulator's, the
payments fake's, the store's statement log and Prefect's API.

    python -m tests.fleet --count 5 --seed 7        # a campaign of random schedules
    python -m pytest -m fleet tests/fleet            # the short CI scenario
"""
