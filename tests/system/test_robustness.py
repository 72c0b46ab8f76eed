"""The daemon must never wedge, die or lose an event: each test is a defect found on the first
release (signal storms, hanging polls, stale hook runs, unusable state directories, hostile
IMDS bodies, huge event text), reproduced against the real daemon process."""

from __future__ import annotations

import json
import os
import random
import signal
import time

import pytest
import structlog

from scheduledeventsd.simulators.azure import Fault
from tests.conftest import VM, logging_fails_on, wait_for

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces need root")


def one_hook(daemons, hooks, event_type="Reboot", body=None):
    cmd = hooks.recorder("a") if body is None else hooks.make("a", body)
    return daemons.config(hooks={"a": [{"command": [cmd]}]}, events={event_type: ["a"]})


def on_read_only_state_dir(daemons, cfg):
    """The daemon started in a mount namespace of its own, where its state_dir is an empty
    read-only tmpfs (root only); it runs degraded and says so. Another process joins that
    namespace with `nsenter -t PID -m`."""
    daemons.state_dir.mkdir()
    wrapper = (
        "unshare",
        "-m",
        "sh",
        "-c",
        f'mount -t tmpfs -o ro,mode=0700 tmpfs {daemons.state_dir} && exec "$@"',
        "sh",
    )
    daemon = daemons.start(cfg, prefix=wrapper)
    assert "Read-only file system" in daemon.wait_log("state_degraded")["error"]
    return daemon


def test_a_storm_of_sighups_neither_wedges_nor_kills_the_daemon(daemons, sim, hooks):
    """300 SIGHUPs in 30 bursts, 0-1 ms apart: the first release stopped polling in 2 runs of 3."""
    daemon = daemons.start(one_hook(daemons, hooks))
    rng = random.Random(7)  # noqa: S311 - gaps between signals, not cryptography
    for _ in range(30):
        for _ in range(10):
            daemon.signal(signal.SIGHUP)
            time.sleep(rng.random() / 1000)
        time.sleep(0.05)
    daemon.polls_seen(sim, 4, timeout=5)
    assert daemon.proc.poll() is None
    assert daemon.logs("config_reloaded")
    event_id = sim.add_event("Reboot", [VM])
    daemon.wait_log("event_approved", event_id=event_id)
    assert "RecursionError" not in daemon.output()
    assert daemon.stop() == 0


def test_an_approval_does_not_wait_for_a_poll_that_hangs(daemons, sim, hooks):
    cfg = one_hook(daemons, hooks, body='while [ ! -f "$OUT/release" ]; do sleep 0.01; done')
    cfg["metadata"]["timeout"] = cfg["metadata"]["first_call_timeout"] = 12
    daemon = daemons.start(cfg)
    event_id = sim.add_event("Reboot", [VM])
    daemon.wait_log("hook_started", event_id=event_id)
    sim.add_fault(Fault("delay", delay=10.0, count=0))  # every GET now hangs 10 s
    time.sleep(0.3)  # let a poll get stuck in the delay
    released = time.monotonic()
    (hooks.out / "release").touch()
    wait_for(lambda: sim.approved(event_id), 10, "the approval")
    waited = next(a.monotonic for a in sim.approvals if a.event_id == event_id) - released
    # Cause: behind the hanging GET it would have waited most of its 10 s.
    assert waited < 5, f"the approval waited {waited:.2f}s behind a hanging poll"
    sim.clear_faults()


def test_a_run_whose_event_left_and_came_back_does_not_approve_it(daemons, sim, hooks):
    """The run stopped because its event left ends as cancelled, whatever it exits with; the
    event back in the document is prepared anew, and only that run's success approves it."""
    body = (
        "trap 'exit 0' TERM\n"  # a hook that cleans up and exits 0 when stopped
        'echo "$$" >> "$OUT/runs"\n'
        'n=$(wc -l < "$OUT/runs")\n'
        'while [ ! -f "$OUT/release$n" ]; do sleep 0.01; done'
    )
    daemon = daemons.start(one_hook(daemons, hooks, body=body))
    event_id = sim.add_event("Reboot", [VM], event_id="E-BACK")
    daemon.wait_log("hook_started", event_id=event_id, run=1)
    sim.remove_event(event_id)
    daemon.wait_log("event_gone_while_hooks_running", event_id=event_id)
    sim.add_event("Reboot", [VM], event_id="E-BACK")
    daemon.wait_log("hook_cancelled", event_id=event_id, run=1)
    daemon.wait_log("hook_started", event_id=event_id, run=2)
    daemon.polls_seen(sim, 3)
    assert not sim.approved(event_id), "the stopped run's exit 0 approved the event"
    (hooks.out / "release2").touch()
    daemon.wait_log("event_approved", event_id=event_id)


def test_a_hook_run_whose_logging_raises_still_ends_in_one_result(in_process, sim):
    """In-process, with a log processor that fails on hook_started (a journald send error)."""
    daemon, thread, capture, _ = in_process

    structlog.configure(processors=[logging_fails_on("hook_started"), capture])
    thread.start()
    event_id = sim.add_event("Reboot", [VM])
    wait_for(
        lambda: any(e["event"] == "event_not_approved" for e in capture.entries),
        what="the run's result",
    )
    stopped = time.monotonic()
    daemon.request_stop()
    thread.join(60)
    assert not thread.is_alive()
    # Cause: waiting for a result that never comes would take the whole 120 s grace.
    assert time.monotonic() - stopped < 60, "shutdown waited for a run that never ended"
    assert not sim.approved(event_id)


def test_a_200_kb_description_still_reaches_the_hooks_and_is_approved(daemons, sim, hooks):
    daemon = daemons.start(one_hook(daemons, hooks))
    event_id = sim.add_event("Reboot", [VM], description="maintenance " * 17_000)
    daemon.wait_log("event_approved", event_id=event_id)
    env = (hooks.out / "a.env").read_text()
    assert "the whole event is on stdin]" in env
    assert len((hooks.out / "a.stdin").read_bytes()) > 200_000


def test_a_hostile_body_5000_arrays_deep_is_a_poll_failure_not_a_crash(daemons, sim, hooks):
    daemon = daemons.start(one_hook(daemons, hooks))
    sim.add_fault(Fault("body", body="[" * 5000 + "]" * 5000, count=3))
    sim.add_fault(
        Fault(
            "body",
            body='{"DocumentIncarnation": 9, "Events": ['
            + '{"a":' * 5000
            + "1"
            + "}" * 5000
            + "]}",
            count=1,
        )
    )
    daemon.wait_log("poll_failed", kind="bad_document")
    event_id = sim.add_event("Reboot", [VM])
    daemon.wait_log("event_approved", event_id=event_id)
    assert daemon.proc.poll() is None
    assert "Traceback" not in daemon.output()


def test_a_state_file_that_is_a_directory_is_moved_aside_and_events_are_handled(
    daemons, sim, hooks
):
    (daemons.state_dir / "state.json").mkdir(parents=True)
    daemon = daemons.start(one_hook(daemons, hooks))
    assert "is a directory" in daemon.wait_log("state_degraded")["error"]
    event_id = sim.add_event("Reboot", [VM])
    daemon.wait_log("event_approved", event_id=event_id)
    daemon.wait_log("state_recovered")
    assert (daemons.state_dir / "state.json").is_file()
    assert list(daemons.state_dir.glob("state.json.corrupt-*"))
    assert daemon.stop() == 0


def test_a_hand_edited_gate_state_in_the_state_file_is_said_once_and_the_rest_is_read(
    daemons, sim, hooks
):
    """A state file whose event has a known gate's slice (`drain`) in a state that gate does
    not have: the daemon says `state_repaired` (which event, which gate, which value), keeps
    the event, and handles events as usual. Before: read without a word."""
    event_id = sim.add_event("Reboot", [VM])
    entry = {"phase": "approved", "rule": "", "stage": "before", "slot": "", "drain": "",
             "boot_id": "", "vm_name": VM, "incarnation": 1, "prepared": True,
             "event": {"EventId": event_id, "EventType": "Reboot", "EventStatus": "Scheduled",
                       "ResourceType": "VirtualMachine", "Resources": [VM],
                       "NotBefore": "Mon, 19 Sep 2039 18:29:47 GMT"},
             "gates": {"drain": "sideways"}}  # fmt: skip
    daemons.state_dir.mkdir(parents=True, exist_ok=True)
    (daemons.state_dir / "state.json").write_text(json.dumps({"version": 2, "events": [entry]}))
    daemon = daemons.start(one_hook(daemons, hooks))
    repaired = daemon.wait_log("state_repaired")
    assert repaired["level"] == "warning"
    assert repaired["error"].startswith(f"{event_id}: gates.drain: 'sideways' is not a state")
    assert not daemon.logs("state_degraded"), "the file is read, not moved aside"
    assert not list(daemons.state_dir.glob("state.json.corrupt-*"))
    other = sim.add_event("Reboot", [VM])
    daemon.wait_log("event_approved", event_id=other)
    assert len(daemon.logs("state_repaired")) == 1
    assert not daemon.logs("event_detected", event_id=event_id), "kept: approved already"
    assert daemon.stop() == 0


def test_an_unusable_state_dir_degrades_but_events_are_still_handled(daemons, sim, hooks, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    cfg = one_hook(daemons, hooks)
    cfg["state_dir"] = str(blocker / "state")
    daemon = daemons.start(cfg)
    assert daemon.wait_log("state_degraded")["level"] == "warning"
    event_id = sim.add_event("Reboot", [VM])
    daemon.wait_log("event_approved", event_id=event_id)
    assert daemon.stop() == 0


@needs_root
def test_a_read_only_state_dir_degrades_but_events_are_still_handled(daemons, sim, hooks):
    daemon = on_read_only_state_dir(daemons, one_hook(daemons, hooks))
    event_id = sim.add_event("Reboot", [VM])
    daemon.wait_log("event_approved", event_id=event_id)
    assert daemon.proc.poll() is None
    assert daemon.stop() == 0
