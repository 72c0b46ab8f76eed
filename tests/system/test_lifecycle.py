"""The whole life of an event, end to end: after-hooks once it is over, cancelled-hooks when
Azure cancels it, and after-hooks after a reboot (a new boot id), with real hook processes."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import time
import uuid

import pytest

from scheduledeventsd.simulators.azure import Fault
from tests.conftest import VM, wait_for

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a bind mount over boot_id needs root")


def env_of(hooks, name):
    return dict(line.split("=", 1) for line in (hooks.out / f"{name}.env").read_text().splitlines())


def lifecycle(daemons, hooks, before_body=None, **rule):
    before = hooks.recorder("drain") if before_body is None else hooks.make("drain", before_body)
    return daemons.config(
        hooks={
            "drain": [{"command": [before]}],
            "undrain": [{"command": [hooks.recorder("undrain")]}],
            "restore": [{"command": [hooks.recorder("restore")]}],
        },
        events={"Reboot": {"before": ["drain"], "after": ["undrain"], **rule}},
    )


def test_after_hooks_run_once_when_the_approved_event_is_over(daemons, sim, hooks):
    daemon = daemons.start(lifecycle(daemons, hooks))
    event_id = sim.add_event("Reboot", [VM])
    daemon.wait_log("event_approved", event_id=event_id)
    done = daemon.wait_log("after_hooks_finished", event_id=event_id)
    assert done["stage"] == "after"
    daemon.polls_seen(sim)
    assert hooks.order() == ["drain", "undrain"], "after-hooks run once, after the event"
    assert env_of(hooks, "drain")["SCHEDULED_EVENT_STAGE"] == "before"
    undrain = env_of(hooks, "undrain")
    assert undrain["SCHEDULED_EVENT_STAGE"] == "after"
    assert undrain["SCHEDULED_EVENT_REBOOTED"] == "0"
    assert undrain["SCHEDULED_EVENT_ID"] == event_id


def test_a_cancelled_event_stops_its_running_hook_then_runs_its_cancelled_hooks(
    daemons, sim, hooks
):
    body = 'echo $$ > "$OUT/drain.pid"\nexec sleep 300'
    cfg = lifecycle(daemons, hooks, before_body=body, cancelled=["restore"])
    daemon = daemons.start(cfg)
    event_id = sim.add_event("Reboot", [VM])
    wait_for((hooks.out / "drain.pid").exists, what="the drain hook to start")
    drain_pid = int((hooks.out / "drain.pid").read_text())
    sim.remove_event(event_id)
    cancelled = daemon.wait_log("event_cancelled", event_id=event_id)
    assert cancelled["level"] == "warning"
    daemon.wait_log("hook_cancelled", event_id=event_id)
    daemon.wait_log("after_hooks_finished", event_id=event_id, stage="cancelled")
    with pytest.raises(ProcessLookupError):
        os.kill(drain_pid, 0)
    assert hooks.order() == ["restore"]
    assert env_of(hooks, "restore")["SCHEDULED_EVENT_STAGE"] == "cancelled"
    assert not sim.approvals


def boot_wrapper(tmp_path):
    """Run the daemon on a boot id of our choosing: write a new UUID to the file to reboot."""
    boot = tmp_path / "boot_id"
    boot.write_text(f"{uuid.uuid4()}\n")
    wrapper = (
        "unshare",
        "-m",
        "sh",
        "-c",
        f'mount --bind {boot} /proc/sys/kernel/random/boot_id && exec "$@"',
        "sh",
    )
    return boot, wrapper


@needs_root
def test_after_the_maintenance_reboot_the_after_hooks_run_once_it_is_listed_started(
    daemons, sim, hooks, tmp_path
):
    """A new boot proves the maintenance only with the event Started (or gone): while IMDS is
    silent nothing runs; once it lists the event Started, the after-hooks run once, with
    SCHEDULED_EVENT_REBOOTED=1 and the name and incarnation the event was seen under."""
    sim.scenario.started_for = None
    sim.scenario.start_after_approval = 600  # the event stays listed across the "reboot"
    boot, wrapper = boot_wrapper(tmp_path)
    cfg = lifecycle(daemons, hooks)
    daemon = daemons.start(cfg, prefix=wrapper)
    event_id = sim.add_event("Reboot", [VM])
    daemon.wait_log("event_approved", event_id=event_id)
    assert daemon.stop() == 0

    boot.write_text(f"{uuid.uuid4()}\n")  # the VM rebooted: the maintenance
    sim.update_event(event_id, EventStatus="Started")
    sim.add_fault(Fault("drop", count=0))  # and IMDS does not answer yet
    again = daemons.start(cfg, prefix=wrapper, ready=False)
    again.wait_log("daemon_starting")
    wait_for(lambda: len(sim.requests) > 0, what="a request")
    time.sleep(2)
    assert hooks.order() == ["drain"], "a new boot alone proves nothing"
    assert not again.logs("reboot_detected")
    sim.clear_faults()
    again.wait_log("reboot_detected", event_id=event_id, stage="after")
    again.wait_log("after_hooks_finished", event_id=event_id)
    undrain = env_of(hooks, "undrain")
    assert undrain["SCHEDULED_EVENT_REBOOTED"] == "1"
    assert undrain["SCHEDULED_EVENT_VM_NAME"] == VM
    # The incarnation of the document that listed it Started, after the one it was drained in.
    drained_in = int(env_of(hooks, "drain")["SCHEDULED_EVENT_DOCUMENT_INCARNATION"])
    listed_in = int(undrain["SCHEDULED_EVENT_DOCUMENT_INCARNATION"])
    assert listed_in > drained_in > 0
    stdin = json.loads((hooks.out / "undrain.stdin").read_text())
    assert (stdin["VmName"], stdin["DocumentIncarnation"]) == (VM, listed_in)
    again.polls_seen(sim)
    sim.remove_event(event_id)
    again.wait_log("event_completed", event_id=event_id)
    again.polls_seen(sim)
    assert hooks.order() == ["drain", "undrain"], "never a second before- or after-run"
    assert not again.logs("event_detected", event_id=event_id)
    again.signal(signal.SIGTERM)


@needs_root
def test_a_crash_reboot_while_the_event_is_still_scheduled_prepares_it_again(
    daemons, sim, hooks, tmp_path
):
    """Issue 26 #1: a Reboot an hour away, its drain running; the VM goes down (daemon and hook
    killed) and comes back on a new boot id while IMDS still lists the event Scheduled. That
    boot was not the maintenance: no undrain, the drain runs again, the event is approved as
    usual, and the undrain runs once, when it really is over (on this boot: REBOOTED=0)."""
    boot, wrapper = boot_wrapper(tmp_path)
    body = (
        'echo drain >> "$OUT/order"\n'
        'env > "$OUT/drain.env"\n'
        'if [ ! -e "$OUT/drained-once" ]; then\n'
        '  touch "$OUT/drained-once"; echo $$ > "$OUT/drain.pid"; exec sleep 300\n'
        "fi"
    )
    cfg = lifecycle(daemons, hooks, before_body=body)
    daemon = daemons.start(cfg, prefix=wrapper)
    event_id = sim.add_event("Reboot", [VM], not_before_in=3600)
    wait_for((hooks.out / "drain.pid").exists, what="the drain hook to start")
    daemon.proc.send_signal(signal.SIGKILL)  # the VM goes down mid-drain
    daemon.proc.wait(10)
    os.kill(int((hooks.out / "drain.pid").read_text()), signal.SIGKILL)

    boot.write_text(f"{uuid.uuid4()}\n")  # it comes back on a new boot: a crash, not Azure
    again = daemons.start(cfg, prefix=wrapper)
    note = again.wait_log("reboot_detected", event_id=event_id)
    assert (note["stage"], note["maintenance"]) == ("before", False)
    again.wait_log("event_approved", event_id=event_id)
    assert hooks.order() == ["drain", "drain"], "prepared again, no undrain"
    assert env_of(hooks, "drain")["SCHEDULED_EVENT_STAGE"] == "before"
    assert sim.approved(event_id)
    # The simulator starts it a second after the approval and drops it 3 s later: over.
    done = again.wait_log("after_hooks_finished", event_id=event_id, timeout=15)
    assert done["stage"] == "after"
    again.polls_seen(sim)
    assert hooks.order() == ["drain", "drain", "undrain"], "after-hooks once, when over"
    assert env_of(hooks, "undrain")["SCHEDULED_EVENT_REBOOTED"] == "0"
    again.signal(signal.SIGTERM)


@needs_root
@pytest.mark.parametrize("status", ["Started", "Scheduled"])
def test_after_a_crash_reboot_an_event_that_dropped_this_vm_gets_its_cancelled_hooks(
    daemons, sim, hooks, tmp_path, status
):
    """Review of issue 26: a Reboot drained for (approve: never), then the VM reboots (a crash);
    the first document lists the event for another VM only. That is not this VM's maintenance:
    it used to be taken as such (reboot_detected stage=after, the undrain with STAGE=after);
    it is handled as leaving, as without a reboot: its cancelled-hooks run, once."""
    sim.scenario.started_for = None
    boot, wrapper = boot_wrapper(tmp_path)
    cfg = lifecycle(daemons, hooks, cancelled=["restore"], approve="never")
    daemon = daemons.start(cfg, prefix=wrapper)
    event_id = sim.add_event("Reboot", [VM], not_before_in=3600)
    daemon.wait_log("approval_skipped", event_id=event_id)
    daemon.proc.send_signal(signal.SIGKILL)
    daemon.proc.wait(10)

    boot.write_text(f"{uuid.uuid4()}\n")
    sim.update_event(event_id, Resources=["vm-other"], EventStatus=status)
    again = daemons.start(cfg, prefix=wrapper)
    again.wait_log("event_cancelled", event_id=event_id)
    again.wait_log("after_hooks_finished", event_id=event_id, stage="cancelled")
    again.polls_seen(sim)
    assert not again.logs("reboot_detected")
    assert hooks.order() == ["drain", "restore"]
    restore = env_of(hooks, "restore")
    assert restore["SCHEDULED_EVENT_STAGE"] == "cancelled"
    assert restore["SCHEDULED_EVENT_REBOOTED"] == "1", "this VM did boot since its drain"
    assert not sim.approvals
    again.signal(signal.SIGTERM)


@needs_root
def test_a_rollback_to_the_previous_release_keeps_the_state_of_an_event_judged_after_a_boot(
    daemons, sim, hooks, tmp_path, previous_release
):
    """Review of issue 26: this release, on a new boot with IMDS silent, saves the event in the
    phase `rebooted` (judged by the next document); rolled back, the previous release logged
    state_degraded ('rebooted' is not a valid Phase), moved the file aside and ran the drain
    again. It reads the file: the event is the one it knew (no event_detected), handled by its
    own rule for a prepared event after a boot (the undrain, REBOOTED=1), nothing moved aside."""
    sim.scenario.started_for = None
    sim.scenario.start_after_approval = 600
    boot = tmp_path / "boot_id"
    boot.write_text(f"{uuid.uuid4()}\n")
    # cd /: python -m takes the package from its working directory before PYTHONPATH.
    mount = f'mount --bind {boot} /proc/sys/kernel/random/boot_id && cd / && exec "$@"'
    wrapper = ("unshare", "-m", "sh", "-c", mount, "sh")
    cfg = lifecycle(daemons, hooks, approve="never")
    daemon = daemons.start(cfg, prefix=wrapper)
    event_id = sim.add_event("Reboot", [VM], not_before_in=3600)
    daemon.wait_log("approval_skipped", event_id=event_id)
    daemon.proc.send_signal(signal.SIGKILL)
    daemon.proc.wait(10)

    boot.write_text(f"{uuid.uuid4()}\n")
    sim.add_fault(Fault("status", status=500, count=0, method="GET"))
    state = daemons.state_dir / "state.json"
    newer = daemons.start(cfg, prefix=wrapper, ready=False)
    wait_for(lambda: "rebooted" in state.read_text(), what="the phase rebooted saved")
    assert newer.stop() == 0
    sim.clear_faults()

    previous = daemons.start(cfg, prefix=wrapper, env={"PYTHONPATH": str(previous_release)})
    previous.wait_log("after_hooks_finished", event_id=event_id)
    previous.polls_seen(sim)
    assert not previous.logs("state_degraded")
    assert not previous.logs("event_detected"), "the event it knew, not a new one"
    assert hooks.order() == ["drain", "undrain"], "no second drain"
    assert env_of(hooks, "undrain")["SCHEDULED_EVENT_REBOOTED"] == "1"
    assert sorted(p.name for p in daemons.state_dir.glob("state.json*")) == ["state.json"]
    previous.signal(signal.SIGTERM)


def test_an_event_whose_resources_name_this_vm_later_is_prepared_and_dropped_again(
    daemons, sim, hooks
):
    """Issue 26 #17: a Reboot listed first for another VM, whose Resources then gain this one
    (same EventId), is judged again: its drain runs. When its Resources drop this VM again, it
    is handled as leaving: its cancelled-hooks run, once."""
    cfg = lifecycle(daemons, hooks, cancelled=["restore"])
    daemon = daemons.start(cfg)
    event_id = sim.add_event("Reboot", ["vm-other"], not_before_in=3600)
    daemon.wait_log("event_ignored", event_id=event_id)
    sim.update_event(event_id, Resources=["vm-other", VM])
    daemon.wait_log("event_detected", event_id=event_id)
    wait_for(lambda: hooks.order() == ["drain"], what="the drain to run")
    daemon.wait_log("approval_skipped", event_id=event_id)  # shared, approve: sole
    sim.update_event(event_id, Resources=["vm-other"])
    daemon.wait_log("event_cancelled", event_id=event_id)
    daemon.wait_log("after_hooks_finished", event_id=event_id, stage="cancelled")
    daemon.polls_seen(sim)
    assert hooks.order() == ["drain", "restore"]
    assert env_of(hooks, "restore")["SCHEDULED_EVENT_VM_NAME"] == VM
    assert not sim.approvals


def test_a_short_freeze_and_a_user_restart_are_approved_without_hooks(daemons, sim, hooks):
    cfg = daemons.config(
        hooks={"a": [{"command": [hooks.recorder("a")]}]},
        events={"Freeze": {"before": ["a"], "short_seconds": 9}, "Reboot": ["a"]},
        user_events="approve",
    )
    daemon = daemons.start(cfg)
    freeze = sim.add_event("Freeze", [VM], duration=5)
    assert daemon.wait_log("event_rule", event_id=freeze)["rule"] == "short"
    daemon.wait_log("event_approved", event_id=freeze)
    restart = sim.add_event("Reboot", [VM], source="User")
    assert daemon.wait_log("event_rule", event_id=restart)["rule"] == "user"
    daemon.wait_log("event_approved", event_id=restart)
    long_freeze = sim.add_event("Freeze", [VM], duration=30)
    daemon.wait_log("event_approved", event_id=long_freeze)
    assert hooks.order() == ["a"], "only the 30 s Freeze ran its hook"


def test_start_before_delays_the_hooks_then_starts_them_on_time(daemons, sim, hooks):
    cfg = daemons.config(
        hooks={"a": [{"command": [hooks.recorder("a")]}]},
        events={"Reboot": {"before": ["a"], "start_before": 898}},
    )
    daemon = daemons.start(cfg)
    event_id = sim.add_event("Reboot", [VM], not_before_in=900)  # hooks due in about 2 s
    waiting = daemon.wait_log("event_waiting", event_id=event_id)
    assert waiting["hooks_start_at"].endswith("Z")
    assert not hooks.order()
    started = daemon.wait_log("hook_started", event_id=event_id, timeout=10)
    due = dt.datetime.fromisoformat(waiting["hooks_start_at"].replace("Z", "+00:00"))
    began = dt.datetime.fromisoformat(started["timestamp"].replace("Z", "+00:00"))
    # Never early (NotBefore has whole seconds: one of rounding), and at its lead time rather
    # than at NotBefore, 900 s away; how promptly is the bench's to measure.
    late = (began - due).total_seconds()
    assert -1.0 <= late < 60
    daemon.wait_log("event_approved", event_id=event_id)


def test_dry_run_logs_its_decisions_and_touches_nothing(daemons, sim, hooks):
    daemon = daemons.start(lifecycle(daemons, hooks), args=("--dry-run",))
    event_id = sim.add_event("Reboot", [VM])
    would = daemon.wait_log("would_run_hooks", event_id=event_id)
    assert (would["dry_run"], would["hooks"], would["stage"]) == (True, "drain", "before")
    daemon.wait_log("would_approve", event_id=event_id)
    sim.remove_event(event_id)
    daemon.wait_log("would_run_hooks", event_id=event_id, stage="after")
    daemon.polls_seen(sim)
    assert hooks.order() == []
    assert not sim.approvals
    assert not daemons.state_dir.exists(), "no state written, no lock taken"
    assert all(r.get("dry_run") is True for r in daemon.records if "event" in r)


def test_dry_run_runs_beside_the_service_on_its_state_directory(daemons, sim, hooks):
    cfg = lifecycle(daemons, hooks)
    service = daemons.start(cfg)
    beside = daemons.start(cfg, args=("--dry-run",), config_name="dry.yaml")
    event_id = sim.add_event("Reboot", [VM])
    service.wait_log("event_approved", event_id=event_id)
    beside.wait_log("would_approve", event_id=event_id)
    assert beside.proc.poll() is None
    assert [a.event_id for a in sim.approvals] == [event_id], "only the service approved"
    assert hooks.order()[:1] == ["drain"]
