"""The pure event logic: given a document, what we know and the policy, what happens next."""

from __future__ import annotations

import datetime as dt

from scheduledeventsd.engine import (
    Approve,
    Note,
    Phase,
    Policy,
    RunHooks,
    Tracked,
    on_approved,
    on_document,
    on_hooks_finished,
    pending_approvals,
    resume,
)
from scheduledeventsd.model import Document, Event

VM = "vm-a"
POLICY = Policy(VM, "sole", {"Reboot": ("drain", "checkpoint"), "Freeze": ()})


def event(event_id="E1", event_type="Reboot", status="Scheduled", resources=(VM,)):
    return Event(
        event_id,
        event_type,
        status,
        "VirtualMachine",
        tuple(resources),
        dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc),
    )


def doc(*events, incarnation=2):
    return Document(incarnation, tuple(events))


def names(actions):
    return [a.name if isinstance(a, Note) else type(a).__name__ for a in actions]


def test_a_new_scheduled_event_for_us_runs_its_hooks_in_configured_order():
    d = on_document(doc(event()), {}, POLICY)
    assert names(d.actions) == ["event_detected", "RunHooks"]
    run = d.actions[1]
    assert isinstance(run, RunHooks)
    assert run.hooks == ("drain", "checkpoint")
    assert d.known["E1"].phase is Phase.RUNNING


def test_an_event_seen_again_does_nothing_twice():
    first = on_document(doc(event()), {}, POLICY)
    again = on_document(doc(event(), incarnation=3), first.known, POLICY)
    assert again.actions == ()
    assert again.known == first.known


def test_events_not_naming_us_are_ignored_once():
    d = on_document(doc(event(resources=("vm-b",))), {}, POLICY)
    assert names(d.actions) == ["event_ignored"]
    assert on_document(doc(event(resources=("vm-b",))), d.known, POLICY).actions == ()


def test_matching_the_vm_name_is_case_insensitive():
    d = on_document(doc(event(resources=("VM-A",))), {}, POLICY)
    assert d.known["E1"].phase is Phase.RUNNING


def test_an_event_first_seen_started_is_missed_and_not_approved():
    d = on_document(doc(event(status="Started")), {}, POLICY)
    assert names(d.actions) == ["event_detected", "event_missed"]
    assert not any(isinstance(a, (Approve, RunHooks)) for a in d.actions)


def test_unconfigured_type_is_left_alone_and_empty_hooks_approve_at_once():
    d = on_document(doc(event("T", "Terminate"), event("F", "Freeze")), {}, POLICY)
    assert d.known["T"].phase is Phase.UNHANDLED
    assert d.known["F"].phase is Phase.APPROVING
    assert any(isinstance(a, Approve) and a.event.event_id == "F" for a in d.actions)


def test_success_approves_a_sole_event_and_failure_does_not():
    running = on_document(doc(event()), {}, POLICY).known
    ok = on_hooks_finished("E1", True, running, POLICY)
    assert isinstance(ok.actions[0], Approve)
    assert pending_approvals(ok.known) == (event(),)
    failed = on_hooks_finished("E1", False, running, POLICY)
    assert names(failed.actions) == ["event_not_approved"]
    assert failed.known["E1"].phase is Phase.HOOKS_FAILED


def test_sole_policy_never_rushes_an_event_shared_with_other_vms():
    shared = event(resources=(VM, "vm-b", "vm-c"))
    running = on_document(doc(shared), {}, POLICY).known
    d = on_hooks_finished("E1", True, running, POLICY)
    assert names(d.actions) == ["approval_skipped"]
    assert "2 other VM(s)" in str(d.actions[0].fields["reason"])
    always = Policy(VM, "always", POLICY.events)
    assert isinstance(on_hooks_finished("E1", True, running, always).actions[0], Approve)
    never = Policy(VM, "never", POLICY.events)
    assert names(on_hooks_finished("E1", True, running, never).actions) == ["approval_skipped"]


def test_an_event_that_started_while_hooks_ran_is_not_approved():
    running = on_document(doc(event()), {}, POLICY).known
    started = on_document(doc(event(status="Started"), incarnation=3), running, POLICY)
    assert names(started.actions) == ["event_status_changed"]
    d = on_hooks_finished("E1", True, started.known, POLICY)
    assert names(d.actions) == ["approval_not_needed"]


def test_a_pending_approval_stops_when_the_event_starts():
    approving = {"E1": Tracked(event(), Phase.APPROVING)}
    d = on_document(doc(event(status="Started")), approving, POLICY)
    assert d.known["E1"].phase is Phase.DONE
    assert pending_approvals(d.known) == ()


def test_approval_accepted_moves_to_approved_and_logs_it():
    approving = {"E1": Tracked(event(), Phase.APPROVING)}
    d = on_approved("E1", approving)
    assert d.known["E1"].phase is Phase.APPROVED
    assert names(d.actions) == ["event_approved"]
    assert on_approved("E1", d.known).actions == ()


def test_events_that_leave_the_document_are_completed_and_forgotten():
    known = {
        "E1": Tracked(event(), Phase.APPROVED),
        "E2": Tracked(event("E2", resources=("x",)), Phase.NOT_OURS),
        "E3": Tracked(event("E3"), Phase.RUNNING),
    }
    d = on_document(doc(), known, POLICY)
    assert d.known == {}
    assert names(d.actions) == ["event_completed", "event_gone", "event_gone_while_hooks_running"]


def test_hooks_finishing_for_a_forgotten_event_change_nothing():
    assert on_hooks_finished("nope", True, {}, POLICY).actions == ()


def test_resume_forgets_interrupted_runs_so_they_run_again_and_keeps_the_rest():
    known = {"E1": Tracked(event(), Phase.RUNNING), "E2": Tracked(event("E2"), Phase.APPROVED)}
    d = resume(known)
    assert list(d.known) == ["E2"]
    assert names(d.actions) == ["hooks_interrupted"]
    again = on_document(doc(event(), event("E2")), d.known, POLICY)
    assert names(again.actions) == ["event_detected", "RunHooks"]
