"""The daemon end to end: a real process polling the simulator over loopback, real hooks."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from scheduledeventsd.simulators.azure import Fault, Simulator
from scheduledeventsd.simulators.scenario import Scenario
from tests.conftest import VM, wait_for


def test_hooks_run_in_order_with_event_env_and_stdin_then_event_is_approved(daemons, sim, hooks):
    cfg = daemons.config(
        hooks={
            "drain": [{"command": [hooks.recorder("drain")]}],
            "checkpoint": [
                {"command": [hooks.recorder("checkpoint")]},
                {"command": [hooks.recorder("checkpoint2")]},
            ],
        },
        events={"Reboot": ["drain", "checkpoint"]},
        environment={"EXTRA": "from-config"},
    )
    daemon = daemons.start(cfg)
    event_id = sim.add_event("Reboot", [VM], description="Host server is undergoing maintenance.")
    wait_for(lambda: sim.approved(event_id), what="approval")
    assert hooks.order() == ["drain", "checkpoint", "checkpoint2"]

    env = dict(line.split("=", 1) for line in (hooks.out / "drain.env").read_text().splitlines())
    assert env["SCHEDULED_EVENT_ID"] == event_id
    assert env["SCHEDULED_EVENT_TYPE"] == "Reboot"
    assert env["SCHEDULED_EVENT_STATUS"] == "Scheduled"
    assert env["SCHEDULED_EVENT_RESOURCES"] == VM
    assert env["SCHEDULED_EVENT_RESOURCE_TYPE"] == "VirtualMachine"
    assert env["SCHEDULED_EVENT_NOT_BEFORE"].endswith("Z")
    assert env["SCHEDULED_EVENT_DESCRIPTION"] == "Host server is undergoing maintenance."
    assert env["SCHEDULED_EVENT_SOURCE"] == "Platform"
    assert env["SCHEDULED_EVENT_DURATION_SECONDS"] == "-1"
    assert int(env["SCHEDULED_EVENT_DOCUMENT_INCARNATION"]) >= 2
    assert env["SCHEDULED_EVENT_VM_NAME"] == VM
    assert env["SCHEDULED_EVENT_HOOK"] == "drain"
    assert env["EXTRA"] == "from-config"
    assert "PYTHONPATH" not in env, "the daemon's own environment must not leak into hooks"

    stdin = json.loads((hooks.out / "checkpoint.stdin").read_text())
    assert stdin["EventId"] == event_id
    assert stdin["Resources"] == [VM]
    assert (hooks.out / "checkpoint2.env").read_text().count("SCHEDULED_EVENT_HOOK=checkpoint") == 1

    daemon.wait_log("event_approved", event_id=event_id)
    assert len(daemon.logs("hook_started", event_id=event_id)) == 3
    assert [a.event_id for a in sim.approvals] == [event_id]
    # The simulator turns it Started, then drops it: the daemon logs it as completed.
    daemon.wait_log("event_completed", event_id=event_id)
    assert daemon.stop() == 0


def test_hook_output_is_logged_line_by_line_with_hook_and_event(daemons, sim, hooks):
    cmd = hooks.make("talk", 'echo "first line"\necho "to stderr" >&2\necho "last"')
    daemon = daemons.start(
        daemons.config(hooks={"talk": [{"command": [cmd]}]}, events={"Freeze": ["talk"]})
    )
    event_id = sim.add_event("Freeze", [VM])
    daemon.wait_log("event_approved", event_id=event_id)
    lines = [
        (r["stream"], r["line"]) for r in daemon.logs("hook_output", event_id=event_id, hook="talk")
    ]
    assert sorted(lines) == sorted(
        [("stdout", "first line"), ("stderr", "to stderr"), ("stdout", "last")]
    )


def test_failing_hook_stops_the_chain_and_withholds_approval(daemons, sim, hooks):
    cfg = daemons.config(
        hooks={
            "a": [{"command": [hooks.recorder("a")]}],
            "b": [{"command": [hooks.make("b", 'echo b >> "$OUT/order"; exit 3')]}],
            "c": [{"command": [hooks.recorder("c")]}],
        },
        events={"Reboot": ["a", "b", "c"]},
    )
    daemon = daemons.start(cfg)
    event_id = sim.add_event("Reboot", [VM])
    record = daemon.wait_log("hook_failed", event_id=event_id)
    assert record["exit_status"] == 3
    daemon.wait_log("event_not_approved", event_id=event_id)
    daemon.polls_seen(sim)
    assert hooks.order() == ["a", "b"]
    assert not sim.approvals


def test_hook_timeout_kills_its_whole_process_group_and_counts_as_failure(daemons, sim, hooks):
    cmd = hooks.make(
        "slow",
        'sleep 300 &\necho $! > "$OUT/grandchild.pid"\nsleep 300',
    )
    cfg = daemons.config(
        hooks={"slow": [{"command": [cmd], "timeout": 1}]}, events={"Preempt": ["slow"]}
    )
    daemon = daemons.start(cfg)
    event_id = sim.add_event("Preempt", [VM], not_before_in=30)
    daemon.wait_log("hook_timed_out", event_id=event_id, timeout=15)
    grandchild = int((hooks.out / "grandchild.pid").read_text())

    def gone() -> bool:
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            return True
        return Path(f"/proc/{grandchild}/stat").read_text().split()[2] == "Z"

    wait_for(gone, 10, "the hook's background child to be killed")
    daemon.wait_log("event_not_approved", event_id=event_id)
    assert not sim.approvals


def test_restart_does_not_rerun_hooks_of_an_event_already_handled(daemons, sim, hooks):
    sim.scenario.started_for = None  # keep the event in the document across the restart
    sim.scenario.start_after_approval = 60
    cfg = daemons.config(
        hooks={"a": [{"command": [hooks.recorder("a")]}]}, events={"Reboot": ["a"]}
    )
    daemon = daemons.start(cfg)
    event_id = sim.add_event("Reboot", [VM])
    daemon.wait_log("event_approved", event_id=event_id)
    assert daemon.stop() == 0

    again = daemons.start(cfg)
    again.polls_seen(sim)
    assert hooks.order() == ["a"]
    assert not again.logs("event_detected", event_id=event_id)
    assert [a.event_id for a in sim.approvals] == [event_id]
    sim.remove_event(event_id)
    again.wait_log("event_completed", event_id=event_id)
    state = json.loads((daemons.state_dir / "state.json").read_text())
    wait_for(
        lambda: not json.loads((daemons.state_dir / "state.json").read_text())["events"],
        what="the completed event to leave the state file",
    )
    assert state["version"] == 2


def test_hooks_cut_off_by_a_crash_run_again_after_restart(daemons, sim, hooks):
    slow = hooks.make(
        "slow",
        'echo slow >> "$OUT/order"\n'
        '[ -f "$OUT/second" ] || { touch "$OUT/second"; echo $$ > "$OUT/first.pid"; sleep 300; }',
    )
    cfg = daemons.config(hooks={"slow": [{"command": [slow]}]}, events={"Redeploy": ["slow"]})
    daemon = daemons.start(cfg)
    event_id = sim.add_event("Redeploy", [VM])
    daemon.wait_log("hook_started", event_id=event_id)
    wait_for((hooks.out / "first.pid").exists, what="the first run to start")
    daemon.signal(signal.SIGKILL)
    daemon.proc.wait(5)
    # A kill -9 leaves the hook's own session running (systemd would end its cgroup): end it.
    os.killpg(int((hooks.out / "first.pid").read_text()), signal.SIGKILL)
    again = daemons.start(cfg)
    again.wait_log("hooks_interrupted", event_id=event_id)
    again.wait_log("event_approved", event_id=event_id)
    assert hooks.order() == ["slow", "slow"]


def test_proxy_variables_are_ignored_and_never_reach_hooks(daemons, sim, hooks):
    proxy = "http://127.0.0.1:9"  # nothing listens there: a proxied request would fail
    env = {
        k: proxy
        for k in (
            "HTTP_PROXY",
            "http_proxy",
            "HTTPS_PROXY",
            "https_proxy",
            "ALL_PROXY",
            "all_proxy",
        )
    }
    env["NO_PROXY"] = ""
    cfg = daemons.config(
        hooks={"a": [{"command": [hooks.recorder("a")]}]}, events={"Freeze": ["a"]}
    )
    daemon = daemons.start(cfg, env=env)
    event_id = sim.add_event("Freeze", [VM])
    wait_for(lambda: sim.approved(event_id), what="approval despite proxy variables")
    assert not daemon.logs("poll_failed")
    assert "PROXY" not in (hooks.out / "a.env").read_text().upper()


def test_requests_carry_metadata_header_and_never_x_forwarded_for_over_one_connection(daemons, sim):
    daemon = daemons.start()
    daemon.polls_seen(sim)
    seen = list(sim.requests)  # a snapshot: the simulator keeps appending
    gets = [r for r in seen if r.path.endswith("scheduledevents")]
    assert len(gets) >= 3
    assert all(r.headers.get("Metadata") == "true" for r in seen)
    assert not any("x-forwarded-for" in {k.lower() for k in r.headers} for r in seen)
    assert len({r.client for r in gets}) == 1, "polls should reuse one kept-alive connection"


def test_shell_metacharacters_in_event_text_stay_data(daemons, sim, hooks, tmp_path):
    marker = tmp_path / "pwned"
    nasty = f'$(touch {marker}) `touch {marker}`; touch {marker} && echo "x" | sh'
    cfg = daemons.config(
        hooks={"a": [{"command": [hooks.recorder("a")]}]},
        events={"Reboot": ["a"]},
        approve="always",
    )
    daemon = daemons.start(cfg)
    event_id = sim.add_event("Reboot", [VM, f"other;touch {marker}"], description=nasty)
    daemon.wait_log("hook_finished", event_id=event_id)
    env = (hooks.out / "a.env").read_text()
    assert f"SCHEDULED_EVENT_DESCRIPTION={nasty}" in env
    assert json.loads((hooks.out / "a.stdin").read_text())["Description"] == nasty
    assert not marker.exists()


def test_event_for_another_vm_is_ignored(daemons, sim, hooks):
    cfg = daemons.config(
        hooks={"a": [{"command": [hooks.recorder("a")]}]}, events={"Reboot": ["a"]}
    )
    daemon = daemons.start(cfg)
    event_id = sim.add_event("Reboot", ["some-other-vm"])
    record = daemon.wait_log("event_ignored", event_id=event_id)
    assert record["reason"] == "not for this VM"
    daemon.polls_seen(sim)
    assert hooks.order() == []
    assert not sim.approvals


def test_resources_match_the_vm_name_case_insensitively(daemons, sim, hooks):
    cfg = daemons.config(
        hooks={"a": [{"command": [hooks.recorder("a")]}]}, events={"Reboot": ["a"]}
    )
    daemons.start(cfg)
    event_id = sim.add_event("Reboot", [VM.upper()])
    wait_for(lambda: sim.approved(event_id), what="approval")


@pytest.mark.parametrize(
    ("policy", "resources", "approved"),
    [
        ("sole", [VM], True),
        ("sole", [VM, "peer-vm"], False),
        ("always", [VM, "peer-vm"], True),
        ("never", [VM], False),
    ],
)
def test_approval_policy_decides_whether_a_prepared_event_is_approved(
    daemons, sim, hooks, policy, resources, approved
):
    cfg = daemons.config(
        hooks={"a": [{"command": [hooks.recorder("a")]}]}, events={"Reboot": ["a"]}, approve=policy
    )
    daemon = daemons.start(cfg)
    event_id = sim.add_event("Reboot", resources)
    if approved:
        daemon.wait_log("event_approved", event_id=event_id)
        assert sim.approved(event_id)
    else:
        record = daemon.wait_log("approval_skipped", event_id=event_id)
        assert policy in record["reason"]
        daemon.polls_seen(sim)
        assert not sim.approvals
    assert hooks.order() == ["a"]


def test_event_first_seen_started_is_logged_missed_and_never_approved(daemons, sim, hooks):
    cfg = daemons.config(
        hooks={"a": [{"command": [hooks.recorder("a")]}]}, events={"Reboot": ["a"]}
    )
    daemon = daemons.start(cfg)
    event_id = sim.add_event("Reboot", [VM], status="Started")
    assert daemon.wait_log("event_missed", event_id=event_id)["level"] == "warning"
    daemon.polls_seen(sim)
    assert hooks.order() == []
    assert not sim.approvals


def test_unconfigured_type_is_left_alone_and_empty_hook_list_approves_at_once(daemons, sim, hooks):
    cfg = daemons.config(hooks={"a": [{"command": [hooks.recorder("a")]}]}, events={"Freeze": []})
    daemon = daemons.start(cfg)
    left_alone = sim.add_event("Terminate", [VM])
    daemon.wait_log("event_unhandled", event_id=left_alone)
    at_once = sim.add_event("Freeze", [VM])
    daemon.wait_log("event_approved", event_id=at_once)
    assert [a.event_id for a in sim.approvals] == [at_once]
    assert hooks.order() == []


def test_malformed_events_are_skipped_and_the_rest_handled(daemons, sim, hooks):
    cfg = daemons.config(
        hooks={"a": [{"command": [hooks.recorder("a")]}]}, events={"Reboot": ["a"]}
    )
    daemon = daemons.start(cfg)
    sim.add_event(raw={"EventId": "BROKEN-1", "EventType": 42, "Resources": VM})
    good = sim.add_event("Reboot", [VM])
    wait_for(lambda: sim.approved(good), what="approval of the good event")
    assert daemon.logs("event_skipped")


@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        (Fault("status", status=500, count=0), "http_500"),
        (Fault("delay", delay=2.5, count=0), "timeout"),
        (Fault("garbage", count=0), "bad_document"),
        (Fault("drop", count=0), "connection"),
    ],
)
def test_imds_faults_are_logged_once_and_the_daemon_recovers(daemons, sim, hooks, fault, kind):
    """Over real HTTP; the backoff and log-on-change rules for every kind are engine tests."""
    cfg = daemons.config(
        hooks={"a": [{"command": [hooks.recorder("a")]}]}, events={"Reboot": ["a"]}
    )
    daemon = daemons.start(cfg)
    sim.add_fault(fault)
    daemon.wait_log("poll_failed", kind=kind)
    start = len(sim.requests)
    wait_for(lambda: len(sim.requests) >= start + 2, 10, "two more failed polls")
    assert len(daemon.logs("poll_failed", kind=kind)) == 1, "a persisting failure is logged once"
    assert daemon.proc.poll() is None
    sim.clear_faults()
    event_id = sim.add_event("Reboot", [VM])
    daemon.wait_log("event_approved", event_id=event_id)
    assert daemon.logs("poll_recovered")


def test_a_400_from_imds_is_reported_as_our_configuration_error(daemons, sim):
    daemon = daemons.start(daemons.config(metadata={"api_version": "2099-01-01"}), ready=False)
    record = daemon.wait_log("imds_rejected_request")
    assert record["level"] == "error"
    assert "api-version is invalid" in record["error"]
    assert daemon.proc.poll() is None


def test_redirects_are_never_followed(daemons, sim):
    elsewhere = Simulator(Scenario(vm_name=VM))
    elsewhere.start()
    try:
        daemon = daemons.start()
        sim.add_fault(Fault("redirect", status=302, location=elsewhere.url, count=0))
        record = daemon.wait_log("poll_failed", kind="redirect")
        assert "not followed" in record["error"]
        wait_for(lambda: len([r for r in list(sim.requests) if r.method == "GET"]) > 5)
        assert len(elsewhere.requests) == 0
    finally:
        elsewhere.stop()


def test_first_call_gets_the_long_timeout_and_later_calls_the_short_one(daemons, sim):
    sim.add_fault(Fault("delay", delay=3.0, count=1))  # > timeout (2), < first_call_timeout (5)
    daemon = daemons.start(ready=False)
    daemon.wait_log("document_changed", timeout=15)
    assert not daemon.logs("poll_failed")
    sim.add_fault(Fault("delay", delay=3.0, count=1))
    daemon.wait_log("poll_failed", kind="timeout")


def test_failed_approval_is_retried_until_accepted(daemons, sim, hooks):
    cfg = daemons.config(
        hooks={"a": [{"command": [hooks.recorder("a")]}]}, events={"Reboot": ["a"]}
    )
    daemon = daemons.start(cfg)
    sim.add_fault(Fault("status", status=500, count=2, method="POST"))
    event_id = sim.add_event("Reboot", [VM])
    approved = daemon.wait_log("event_approved", event_id=event_id, timeout=15)
    assert approved["attempts"] == 3
    assert len(daemon.logs("approval_failed", event_id=event_id)) == 1, "logged once per change"
    assert hooks.order() == ["a"]


def test_sigterm_lets_running_hooks_finish_then_exits_zero(daemons, sim, hooks):
    cmd = hooks.make("slow", 'sleep 1.5\necho done >> "$OUT/order"')
    daemon = daemons.start(
        daemons.config(hooks={"slow": [{"command": [cmd]}]}, events={"Reboot": ["slow"]})
    )
    event_id = sim.add_event("Reboot", [VM])
    daemon.wait_log("hook_started", event_id=event_id)
    daemon.signal(signal.SIGTERM)
    assert daemon.proc.wait(15) == 0
    assert hooks.order() == ["done"]
    assert daemon.logs("hook_finished", event_id=event_id)
    assert daemon.logs("daemon_stopped")
    assert sim.approved(event_id), (
        "a hook that finished during the grace period still gets approved"
    )


def test_shutdown_grace_expiry_kills_hooks_and_leaves_them_interrupted_to_run_again(
    daemons, sim, hooks
):
    cmd = hooks.make("slow", 'echo run >> "$OUT/order"\nsleep 300')
    cfg = daemons.config(
        hooks={"slow": [{"command": [cmd]}]}, events={"Reboot": ["slow"]}, shutdown_grace=0.5
    )
    daemon = daemons.start(cfg)
    event_id = sim.add_event("Reboot", [VM])
    daemon.wait_log("hook_started", event_id=event_id)
    started = time.monotonic()
    daemon.signal(signal.SIGTERM)
    assert daemon.proc.wait(60) == 0
    # Cause, not speed: far sooner than the hook's own 300 s, so the grace ended it.
    assert time.monotonic() - started < 60
    assert daemon.logs("hooks_cancelled")
    state = json.loads((daemons.state_dir / "state.json").read_text())
    assert [e["phase"] for e in state["events"]] == ["interrupted"]


def test_sighup_applies_a_valid_config_and_keeps_the_old_one_when_invalid(daemons, sim, hooks):
    cfg = daemons.config(
        hooks={"a": [{"command": [hooks.recorder("a")]}]}, events={"Reboot": ["a"]}
    )
    daemon = daemons.start(cfg)

    broken = dict(cfg, approve="sometimes")
    daemons.write_config(broken)
    daemon.signal(signal.SIGHUP)
    daemon.wait_log("config_reload_failed")
    assert any("approve" in r["error"] for r in daemon.logs("config_invalid"))
    first = sim.add_event("Reboot", [VM])
    daemon.wait_log("event_approved", event_id=first)

    daemons.write_config(dict(cfg, events={"Reboot": ["a"], "Freeze": ["a"]}, approve="never"))
    daemon.signal(signal.SIGHUP)
    daemon.wait_log("config_reloaded")
    second = sim.add_event("Freeze", [VM])
    daemon.wait_log("approval_skipped", event_id=second)
    assert hooks.order() == ["a", "a"]
    assert daemon.proc.poll() is None


def test_vm_name_auto_is_learned_from_imds(daemons, sim):
    daemon = daemons.start(daemons.config(vm_name="auto"))
    record = daemon.wait_log("vm_name")
    assert record["vm_name"] == VM
    assert record["source"] == "imds"


def test_a_second_daemon_on_the_same_state_dir_refuses_to_start(daemons):
    daemons.start()
    second = daemons.start(ready=False)
    assert second.proc.wait(10) == 1
    assert second.logs("state_unavailable")


def test_without_the_name_from_imds_the_hostname_stands_in_until_imds_answers(daemons, sim, hooks):
    sim.add_fault(Fault("status", status=503, count=1, path="/metadata/instance"))
    cfg = daemons.config(
        hooks={"a": [{"command": [hooks.recorder("a")]}]}, events={"Reboot": ["a"]}
    )
    daemon = daemons.start(cfg, ready=False)
    fallback = daemon.wait_log("vm_name_fallback")
    assert fallback["vm_name"] == socket.gethostname()
    learned = daemon.wait_log("vm_name", source="imds", timeout=10)
    assert learned["vm_name"] == VM
    event_id = sim.add_event("Reboot", [VM])
    daemon.wait_log("event_approved", event_id=event_id)


def test_a_hook_that_fails_on_its_own_during_shutdown_counts_as_failed_not_cut_off(
    daemons, sim, hooks
):
    cmd = hooks.make("bad", "sleep 1\nexit 3")
    daemon = daemons.start(
        daemons.config(hooks={"bad": [{"command": [cmd]}]}, events={"Reboot": ["bad"]})
    )
    event_id = sim.add_event("Reboot", [VM])
    daemon.wait_log("hook_started", event_id=event_id)
    daemon.signal(signal.SIGTERM)
    assert daemon.proc.wait(15) == 0
    state = json.loads((daemons.state_dir / "state.json").read_text())
    assert [e["phase"] for e in state["events"]] == ["hooks_failed"], "it must not run again"
