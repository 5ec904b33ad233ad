"""A person's action keeps its meaning on a fleet (DESIGN.md points 11 and 14).

**A cancel then a resume** (the run holding the workflow set Cancelling through
Prefect's API, as the UI's Cancel button does):

- the store says ``cancelled`` (the sweep the cancel triggered ended it), unless the
  workflow finished first; and every chat of it is archived by then (one paused on an
  effect in flight is left to a later sweep: a figure);
- nothing relaunches it: no run of it is made between the cancel and the resume, and
  the first epoch taken after the cancel is the resume's;
- no prompt of it lands in Coder from the cancel until the resume takes it over;
- the cancelled run ends Cancelled in Prefect (or Crashed, when a fault took its host);
- ``resume_workflow`` accepts it (and the usual checks hold the resumed run to the
  rest: finished, nothing finished sent again, each effect once).

**A changed prompt** (the workflow run again from its deployment, its first prompt
reworded): the run fails with ``PromptChanged``; it takes no epoch, no write of its
connections commits, no action of its sockets reaches Coder, and the reworded prompt
lands nowhere.
"""

from __future__ import annotations

from datetime import datetime

from prefect.client.schemas.objects import FlowRun, StateType

from prefect_coder.tasks.lost_runs import replaces_tag

from .evidence import Evidence
from .people import PersonRecord
from .plan import CHANGED
from .storelog import ended, epochs
from .verdicts import Findings

#: States the cancelled run may end in: Cancelled, or Crashed when a fault took its host.
CANCELLED_RUN = frozenset({StateType.CANCELLED, StateType.CRASHED})


def check_people(ev: Evidence) -> Findings:
    findings = Findings()
    for record in ev.played.people:
        findings.figures.append(f"person: {record.describe()}")
        if not record.done:
            continue
        if record.person.kind == "cancel-resume":
            findings.merge(_cancel(ev, record))
        else:
            findings.merge(_changed(ev, record))
    return findings


def _cancel(ev: Evidence, record: PersonRecord) -> Findings:
    findings, wf = Findings(), record.workflow_id

    def violation(detail: str) -> None:
        findings.add("people's actions", f"{wf} {record.person.describe()}: {detail}")

    if record.failure:
        violation(record.failure)
    run = _run(ev, wf, record.run_id)
    if run is not None and (run.state is None or run.state.type not in CANCELLED_RUN):
        violation(f"the cancelled run {run.name} ended {_said(run)}")
    if record.cancelled_seen is None:
        return findings  # it finished first, or the failure above says what happened
    for chat in record.live_at_cancel:
        if "[requires_action]" in chat:
            findings.figures.append(f"{wf}: the cancel left chat {chat} for a later sweep")
        else:
            violation(f"chat {chat} was left unarchived by the cancel")
    cancelled = ended(ev.writes, wf, ("cancelled",))
    if cancelled is None:
        violation("the store's log holds no write of it cancelled")
        return findings
    for problem in _relaunched(ev, record, cancelled.at) + _landed(ev, wf, cancelled.at):
        violation(problem)
    return findings


def _relaunched(ev: Evidence, record: PersonRecord, cancelled: datetime) -> list[str]:
    """Runs made between the cancel and the resume, and an epoch taken after the
    workflow was stored cancelled by a run other than the resume."""
    wf, problems = record.workflow_id, []
    resume = _run(ev, wf, record.resumed_run)
    until = resume.created if resume is not None else None
    for other in ev.runs[wf]:
        made, acted = other.created, record.acted_at
        if str(other.id) in (record.resumed_run, record.run_id) or made is None or acted is None:
            continue
        if acted < made and (until is None or made < until):
            problems.append(f"run {other.name} of it was made after the cancel, before the resume")
    later = [t for t in epochs(ev.writes, wf) if t.at > cancelled]
    if later and later[0].flow_run_id not in _the_resume(ev, wf, record.resumed_run):
        problems.append(
            f"epoch {later[0].epoch} was taken after the cancel by run "
            f"{ev.run_name(later[0].flow_run_id)}, not by the resume"
        )
    return problems


def _the_resume(ev: Evidence, wf: str, resumed_run: str | None) -> set[str]:
    """The resume's run, and the relaunches of it (fleet 25/7: the resume lost the store
    before it began the workflow, and the sweep launched it again, tagged as its
    replacement): each carries out the person's resume."""
    resume = {resumed_run} if resumed_run else set()
    grew = True
    while grew:
        relaunches = {
            str(run.id)
            for run in ev.runs[wf]
            if any(replaces_tag(r) in (run.tags or []) for r in resume)
        }
        grew = not relaunches <= resume
        resume |= relaunches
    return resume


def _landed(ev: Evidence, wf: str, cancelled: datetime) -> list[str]:
    """Prompts of the workflow that landed after it was stored cancelled and before an
    epoch was taken again (the resume's)."""
    later = [t.at for t in epochs(ev.writes, wf) if t.at > cancelled]
    resumed = later[0] if later else None
    return [
        f"a prompt landed {(p.created_at - cancelled).total_seconds():.1f}s after the "
        f"workflow was stored cancelled, before the resume: {p.text()[:80]!r}"
        for p in ev.truth.prompts(wf)
        if cancelled < p.created_at and (resumed is None or p.created_at < resumed)
    ]


def _changed(ev: Evidence, record: PersonRecord) -> Findings:
    findings, wf, run_id = Findings(), record.workflow_id, record.run_id

    def violation(detail: str) -> None:
        findings.add("people's actions", f"{wf} {record.person.describe()}: {detail}")

    # A run lost before it began (its host cut off) is launched again by the sweep, with
    # the same reworded prompt: the last of them must be refused, and none may act.
    chain = _relaunched_chain(ev, wf, run_id)
    ids = {str(r.id) for r in chain}
    last = chain[-1] if chain else None
    if last is not None and str(last.id) in ev.played.silenced:
        findings.figures.append(
            f"person: {wf}: {record.person.describe()}: run {last.name} was still going after "
            "the quiet limit and the lab killed it: how it would have ended is not judged"
        )
    elif last is not None and last.start_time is not None and not _refused(last):
        violation(f"the run with a changed prompt ended {_said(last)}")
    for taken in epochs(ev.writes, wf):
        if taken.flow_run_id in ids:
            violation(f"the run with a changed prompt took epoch {taken.epoch}")
    for write in ev.writes:
        sighting = ev.witness.who(write.src, write.committed.timestamp())
        if sighting is not None and sighting.flow_run_id in ids:
            violation(f"the run with a changed prompt wrote {write.describe()}")
    for request in ev.requests:
        if request.flow_run_id in ids and request.action is not None:
            violation(f"the run with a changed prompt reached Coder: {request.describe()}")
    for prompt in ev.truth.prompts(wf):
        if CHANGED in prompt.text():
            violation(f"the reworded prompt landed in chat {prompt.chat_id}")
    return findings


def _run(ev: Evidence, wf: str, run_id: str) -> FlowRun | None:
    return next((r for r in ev.runs[wf] if str(r.id) == run_id), None)


def _relaunched_chain(ev: Evidence, wf: str, run_id: str) -> list[FlowRun]:
    """The run, then each run the sweep launched in place of the one before, in order."""
    chain: list[FlowRun] = []
    run = _run(ev, wf, run_id)
    while run is not None and run not in chain:
        chain.append(run)
        tag = replaces_tag(run.id)
        run = next((r for r in ev.runs[wf] if tag in r.tags), None)
    return chain


def _refused(run: FlowRun) -> bool:
    state = run.state
    return (
        state is not None
        and state.type == StateType.FAILED
        and "PromptChanged" in (state.message or "")
    )


def _said(run: FlowRun) -> str:
    state = run.state
    if state is None:
        return "with no state"
    return f"{state.type.value}/{state.name}: {(state.message or '')[:160]}"
