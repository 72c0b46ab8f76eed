"""A daemon configured for Pacemaker on a machine whose cluster cannot be reached (the real
cluster tools, no cluster in this network namespace): it says so at start, holds the drain
(`tool_failed`), runs the before-hooks, never approves early, and keeps polling. These configs
keep the old spelling `coordination.pacemaker` on purpose: a file written before `cluster` was
split from `coordination` still runs the daemon the same (test_pacemaker.py uses the new)."""

from __future__ import annotations

import pytest

from tests.conftest import cli, wait_for
from tests.pacemaker_cluster import missing


@pytest.fixture(autouse=True)
def tools() -> None:
    why = missing()
    if why is not None:
        pytest.fail(f"the cluster tools are needed: {why}")


def test_an_unreachable_cluster_is_reported_and_its_events_held_not_approved(daemons, sim, hooks):
    before = hooks.recorder("before")
    cfg = daemons.config(
        vm_name="vm-a",
        approve="always",
        hooks={"before": [{"command": [before]}]},
        events={"Reboot": ["before"]},
        coordination={"pacemaker": {}},
    )
    daemon = daemons.start(cfg)
    unready = daemon.wait_log("cluster_unready", timeout=20)
    assert "the cluster cannot be read" in unready["problems"][0]
    event_id = sim.add_event("Reboot", ["vm-a"], not_before_in=600)
    hold = daemon.wait_log("cluster_hold", timeout=20)
    assert hold["reason"] == "tool_failed"
    assert "crm_" in hold["error"]
    daemon.wait_log("hook_finished", timeout=20)
    assert hooks.order() == ["before"]
    assert daemon.wait_log("event_not_approved", timeout=10)["cause"] == "cluster_hold"
    daemon.polls_seen(sim)
    assert not [a for a in sim.approvals if a.event_id == event_id]


def test_status_shows_the_cluster_unready_and_exits_1_while_it_cannot_drain_this_node(
    daemons,
):
    """The README's migration check ("`status` shows no `cluster_unready`") can be made: the
    readiness is in `status` (text and --json), and the exit status says so."""
    cfg = daemons.config(vm_name="vm-a", hooks={}, events={}, coordination={"pacemaker": {}})
    daemon = daemons.start(cfg)
    daemon.wait_log("cluster_unready", timeout=20)
    shown = wait_for(
        lambda: (r := cli("status", "--config", str(daemon.config_path))).returncode and r,
        10,
        "status to exit 1",
    )
    assert shown.returncode == 1
    assert "pacemaker: cluster_unready" in shown.stdout
    assert "PROBLEM: cluster_unready: the cluster cannot be read" in shown.stdout
    doc = cli("status", "--config", str(daemon.config_path), "--json")
    pacemaker = __import__("json").loads(doc.stdout)["pacemaker"]
    assert pacemaker["ready"] is False
    assert pacemaker["problems"][0].startswith("the cluster cannot be read")


def test_check_config_refuses_the_section_without_the_cluster_tools(tmp_path, monkeypatch):
    """The tools are looked for in fixed directories, never the caller's PATH."""
    from scheduledeventsd.config import ConfigError, fleet, loader  # noqa: PLC0415

    raw = {"coordination": {"pacemaker": {}}, "hooks": {}, "events": {}}
    loader.parse(raw, "t.yaml", check_files=True)  # installed: accepted
    monkeypatch.setattr(fleet, "TOOL_PATH", str(tmp_path))  # a machine without them
    with pytest.raises(ConfigError) as e:
        loader.parse(raw, "t.yaml", check_files=True)
    (problem,) = e.value.problems
    assert problem.startswith("t.yaml: coordination.pacemaker: the cluster tools are missing")
    assert "pacemaker-cli-utils" in problem


def test_with_a_gate_and_a_cluster_a_shared_event_asks_the_gate_not_the_cluster(
    daemons, sim, hooks
):
    """Issue 27: `cluster` beside `coordination.gate`. A shared Freeze (a type the cluster does
    not drain for) waits for the other VMs through the gate the file names: the daemon runs it
    and approves on its 0. Before, with a drainer present, every gate question went to the
    cluster (which, unreachable here, would never answer yes)."""
    before = hooks.recorder("before")
    gate = hooks.recorder("gate")
    cfg = daemons.config(
        vm_name="vm-a",
        approve="all",
        hooks={"before": [{"command": [before]}]},
        events={"Freeze": ["before"]},
        coordination={"gate": {"command": [gate], "interval": 1}},
        cluster={"pacemaker": {}},
    )
    daemon = daemons.start(cfg)
    daemon.wait_log("cluster_unready", timeout=20)
    event_id = sim.add_event("Freeze", ["vm-a", "vm-b"], not_before_in=600)
    coordinating = daemon.wait_log("event_coordinating", timeout=20)
    assert coordinating["via"] == "gate"
    wait_for(lambda: any(a.event_id == event_id for a in sim.approvals), 20, "the approval")
    assert hooks.order() == ["before", "gate"]
    assert "SCHEDULED_EVENT_STAGE=gate" in (hooks.out / "gate.env").read_text()


def test_a_dry_run_says_it_would_restore_the_node_then_shows_the_after_hooks(daemons, sim, hooks):
    """Issue 27: the after-hooks wait for the answer to the engine's RestoreNode. --dry-run,
    which does not touch the node, must still answer it, or the after-hooks it shows never come
    (the state file says this daemon marked the node for an event it approved)."""
    import datetime as dt  # noqa: PLC0415

    from scheduledeventsd.config import DrainMethod  # noqa: PLC0415
    from scheduledeventsd.engine import ClusterMark, Drain, Phase, Tracked  # noqa: PLC0415
    from scheduledeventsd.host.store import StateStore  # noqa: PLC0415
    from scheduledeventsd.model import Event  # noqa: PLC0415

    not_before = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) + dt.timedelta(hours=1)
    event = Event("E-dry", "Reboot", "Scheduled", "VirtualMachine", ("vm-a",), not_before)
    StateStore(daemons.state_dir).save(
        {"E-dry": Tracked(event, Phase.APPROVED, drain=Drain.DONE, vm_name="vm-a")},
        ClusterMark(DrainMethod.HEALTH, "#health-scheduledevents"),
    )
    cfg = daemons.config(
        vm_name="vm-a",
        hooks={"after": [{"command": [hooks.recorder("after")]}]},
        events={"Reboot": {"before": [], "after": ["after"]}},
        cluster={"pacemaker": {}},
    )
    sim.add_event("Reboot", ["vm-a"], event_id="E-dry", not_before_in=3600)
    daemon = daemons.start(cfg, args=("--dry-run",))
    daemon.polls_seen(sim)
    sim.remove_event("E-dry")
    daemon.wait_log("would_restore_node", event_id="E-dry", timeout=20)
    daemon.wait_log("would_run_hooks", event_id="E-dry", stage="after", timeout=20)
    assert hooks.order() == [], "nothing run"
