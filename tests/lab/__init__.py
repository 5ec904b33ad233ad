"""The lab core shared by the crash tests, the fault campaign and the fleet lab.

One module a concept: the steps a workflow is planned as (:mod:`.steps`, with the
answer schemas in :mod:`.schemas`) and how one is drawn (:mod:`.drawing`), the
verdicts' tally (:mod:`.verdicts`), the simulator's ground truth (:mod:`.truth`), the
report and timeline helpers (:mod:`.report`), and the child processes the crash lab
runs and kills (:mod:`.children`, :mod:`.child`; the ``lab`` fixture in
:mod:`.fixtures`). The labs import these and never one another's modules.
"""
