"""The leaks the lifecycle issue found, each reproduced end to end: the real daemon, the
simulator on loopback, real hook processes and a real sd_notify socket. (Leak 2, after-hooks
after a reboot with no VM name, is in test_lifecycle's reboot test; leaks 4 and 6 are proven by
the model in test_promises.)"""

from __future__ import annotations

import json
import signal

import pytest
import structlog

from scheduledeventsd import engine
from scheduledeventsd.engine import DocumentFetched, Phase, PollFailed
from scheduledeventsd.engine.lifecycle import On
from scheduledeventsd.simulators.azure import Fault
from tests.conftest import VM, logging_fails_on, receive, wait_for

OUT_OF_RANGE = "9999-12-31T23:59:59-01:00"  # parses, but is past year 9999 in UTC


def state_phases(daemons) -> list[str]:
    state = json.loads((daemons.state_dir / "state.json").read_text())
    return [e["phase"] for e in state["events"]]


def test_a_not_before_past_year_9999_is_skipped_and_the_daemon_goes_on(daemons, sim, hooks):
    """Leak 1: that one IMDS value crashed every step, and every restart, in a loop."""
    cfg = daemons.config(
        hooks={"a": [{"command": [hooks.recorder("a")]}]}, events={"Reboot": ["a"]}
    )
    daemon = daemons.start(cfg)
    sim.add_from_spec({"EventType": "Reboot", "NotBefore": OUT_OF_RANGE, "EventId": "E-FAR"})
    skipped = daemon.wait_log("event_skipped")
    assert "out of range" in skipped["reason"]
    event_id = sim.add_event("Reboot", [VM])
    daemon.wait_log("event_approved", event_id=event_id)
    assert daemon.proc.poll() is None
    assert not daemon.logs("internal_error")


def test_any_exception_in_a_step_is_logged_once_counted_and_survived(in_process, sim, monkeypatch):
    """Leak 1, the general case: a step that raises drops its message, never the daemon, and
    what that message held (here the poll in flight) is released: polling goes on."""
    daemon, thread, capture, textfile = in_process
    original = engine._HANDLERS[PollFailed]

    def broken(state, msg, now, out):
        raise RuntimeError("a defect in the poll-failure rule")

    monkeypatch.setitem(engine._HANDLERS, PollFailed, broken)  # type: ignore[arg-type]
    sim.add_fault(Fault("status", count=2, status=500))
    thread.start()
    wait_for(
        lambda: len([e for e in capture.entries if e["event"] == "internal_error"]) >= 2,
        what="two faulty steps",
    )
    errors = [e for e in capture.entries if e["event"] == "internal_error"]
    assert "a defect in the poll-failure rule" in (errors[0]["traceback"] or "")
    assert errors[1]["traceback"] is None, "the same failure's traceback is logged once"
    assert errors[0]["dropped"] == "PollFailed"
    monkeypatch.setitem(engine._HANDLERS, PollFailed, original)
    event_id = sim.add_event("Reboot", [VM])
    wait_for(lambda: sim.approved(event_id), what="an event handled after the faults")
    assert "DEGRADED: 2 internal error(s)" in engine.status_text(daemon.state)
    wait_for(
        lambda: "scheduledeventsd_internal_errors_total 2.0" in textfile.read_text(),
        what="the counter in the metrics textfile",
    )


def refusing(kind: str, refuse: str):
    """The document handler, with a defect for any document listing the event `refuse`: it
    raises (internal_error), or makes a move the lifecycle table does not declare
    (transition_refused). Other documents are handled as ever."""
    original = engine._HANDLERS[DocumentFetched]

    def handler(state, msg, now, out):
        state = original(state, msg, now, out)
        if refuse not in {e.event_id for e in msg.document.events}:
            return state
        if kind == "raises":
            raise RuntimeError("a defect in the document rule")
        tracked = state.events[refuse]  # approved before its hooks ran: not declared
        return engine._with(state, refuse, engine._move(tracked, On.ACCEPTED, Phase.APPROVED))

    return handler


@pytest.mark.parametrize(
    ("kind", "said"), [("raises", "internal_error"), ("refused", "transition_refused")]
)
def test_a_refused_document_is_said_once_and_refused_quietly_at_every_poll_after(
    in_process, sim, monkeypatch, kind, said
):
    """A document whose step raises (or that the lifecycle table refuses) is dropped, and
    polled again 2 s later: the same document is refused again, each time. Said once per
    document (its incarnation), counted each time (DEGRADED, the internal errors metric);
    another document is said again; one that can be handled is. Before: said at every poll,
    every 2 s, for as long as IMDS served it."""
    daemon, thread, capture, _ = in_process
    monkeypatch.setitem(engine._HANDLERS, DocumentFetched, refusing(kind, "E-BAD"))
    sim.add_from_spec({"EventType": "Freeze", "EventId": "E-BAD", "Resources": [VM]})
    thread.start()

    def said_for() -> list[dict]:
        return [e for e in capture.entries if e["event"] == said]

    (first,) = wait_for(said_for, what=f"{said} for the bad document")
    assert first["incarnation"] == sim.incarnation
    polls = sim.gets()
    wait_for(lambda: sim.gets() >= polls + 3, timeout=15, what="three more polls of it")
    assert len(said_for()) == 1, "refused again at each poll, quietly"
    assert daemon.state.faults >= 4, "each refusal counted: status says DEGRADED"
    other = sim.add_event("Freeze", ["another-vm"])  # a new document, still listing E-BAD
    wait_for(lambda: len(said_for()) == 2, what="the new document said once")
    assert said_for()[1]["incarnation"] == sim.incarnation
    sim.remove_event("E-BAD")
    wait_for(lambda: any(e["event"] == "event_ignored" and e.get("event_id") == other
                         for e in capture.entries), what="a good document handled")  # fmt: skip
    assert len(said_for()) == 2


def test_an_effect_that_raises_ends_as_its_failure_and_polling_goes_on(in_process, sim):
    """A Fetch that cannot be handed to its lane is a failed poll, retried: not a poll left
    in flight forever (the daemon alive but blind)."""
    daemon, thread, capture, _ = in_process
    order = daemon._poller.order
    calls = []

    def refuse_once(at, call, on_error):
        calls.append(call)
        if len(calls) == 2:
            raise RuntimeError("the poll lane is gone")
        order(at, call, on_error)

    daemon._poller.order = refuse_once
    thread.start()
    wait_for(lambda: len(calls) >= 6, what="polls after the refused one")
    (error,) = [e for e in capture.entries if e["event"] == "internal_error"]
    assert error["where"] == "effect Fetch"
    event_id = sim.add_event("Reboot", [VM])
    wait_for(lambda: sim.approved(event_id), what="an event handled after it")


def test_an_exception_in_an_effect_skips_that_effect_only(in_process, sim):
    """A record that cannot be logged (journald gone) loses that record, not the event."""
    _, thread, capture, _ = in_process

    structlog.configure(processors=[logging_fails_on("event_detected"), capture])
    thread.start()
    event_id = sim.add_event("Reboot", [VM])
    wait_for(lambda: sim.approved(event_id), what="the approval")
    (error,) = [e for e in capture.entries if e["event"] == "internal_error"]
    assert error["where"] == "effect Record"


def test_a_restart_mid_drain_then_a_cancellation_runs_the_cancelled_hooks(daemons, sim, hooks):
    """Leak 3: the package's postinst restarts the service; a drain cut off by it is known
    after the restart, and its event cancelled meanwhile gets its cancelled-hooks."""
    slow = hooks.make("drain", 'echo drain >> "$OUT/order"\nexec sleep 300')
    cfg = daemons.config(
        hooks={
            "drain": [{"command": [slow]}],
            "restore": [{"command": [hooks.recorder("restore")]}],
        },
        events={"Reboot": {"before": ["drain"], "cancelled": ["restore"]}},
        shutdown_grace=0.5,
    )
    daemon = daemons.start(cfg)
    event_id = sim.add_event("Reboot", [VM])
    daemon.wait_log("hook_started", event_id=event_id)
    assert daemon.stop() == 0
    assert state_phases(daemons) == ["interrupted"]
    sim.remove_event(event_id)  # Azure cancelled it while the daemon was down

    again = daemons.start(cfg, ready=False)
    again.wait_log("event_cancelled", event_id=event_id)
    again.wait_log("after_hooks_finished", event_id=event_id, stage="cancelled")
    assert hooks.order() == ["drain", "restore"], "the half-done drain is undone, once"
    again.polls_seen(sim)
    assert not sim.approvals


def test_a_drain_cut_off_at_shutdown_that_exits_0_is_not_approved(daemons, sim, hooks):
    """Leak 5: a hook that traps SIGTERM and exits 0 did not finish its drain."""
    body = "echo drain >> \"$OUT/order\"\ntrap 'exit 0' TERM\nwhile :; do sleep 0.05; done"
    cfg = daemons.config(
        hooks={"drain": [{"command": [hooks.make("drain", body)]}]},
        events={"Reboot": ["drain"]},
        shutdown_grace=0.5,
    )
    daemon = daemons.start(cfg)
    event_id = sim.add_event("Reboot", [VM])
    daemon.wait_log("hook_started", event_id=event_id)
    assert daemon.stop() == 0
    cancelled = daemon.logs("hook_cancelled", event_id=event_id)
    assert [c["exit_status"] for c in cancelled] == [0]
    assert not sim.approvals, "an interrupted drain approved its event"
    assert state_phases(daemons) == ["interrupted"]


def test_a_sighup_during_the_stop_never_says_ready_again(daemons, sim, hooks, notify_socket):
    """Leak 7: after STOPPING=1, systemd must never see READY=1 (it would think we are back)."""
    path, sock = notify_socket
    slow = hooks.make("drain", "exec sleep 300")
    cfg = daemons.config(
        hooks={"drain": [{"command": [slow]}]}, events={"Reboot": ["drain"]}, shutdown_grace=3
    )
    daemon = daemons.start(cfg, env={"NOTIFY_SOCKET": path})
    event_id = sim.add_event("Reboot", [VM])
    daemon.wait_log("hook_started", event_id=event_id)
    daemon.signal(signal.SIGTERM)
    daemon.wait_log("daemon_stopping")
    for _ in range(3):
        daemon.signal(signal.SIGHUP)
    daemon.wait_log("reload_ignored")
    assert daemon.proc.wait(30) == 0
    messages = receive(sock)
    stopping = next(i for i, m in enumerate(messages) if m.get("STOPPING") == "1")
    assert not [m for m in messages[stopping:] if m.get("READY") == "1"]
    assert not daemon.logs("config_reloaded")
