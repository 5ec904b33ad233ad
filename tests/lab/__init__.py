"""The lab core shared by the crash tests, the fault campaign and the fleet lab.

One module a concept: the steps a workflow is planned as (:mod:`.steps`, the answer
schemas in :mod:`.schemas`) and how one is drawn (:mod:`.drawing`); the verdicts' tally
(:mod:`.verdicts`) and how a step's attempts pair up (:mod:`.resends`); the simulator's
ground truth (:mod:`.truth`) and the places the token must not reach (:mod:`.leaks`);
the report's shared words and results (:mod:`.report`); background work (:mod:`.tasks`);
and the child processes the crash lab runs and kills (:mod:`.children`, :mod:`.child`;
the ``lab`` fixture in :mod:`.fixtures`). The labs import these and never one another's
modules (tests/unit/test_test_layout.py holds that).
"""
