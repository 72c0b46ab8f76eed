"""Concurrency slots through a real 3-member etcd cluster: three daemons of one group, each
with a Reboot of its own and long notice, go through early maintenance one (or `max`) at a
time; a holder killed -9 frees its slot within the lease's TTL; without etcd nobody is
approved early, and the hooks still start at the deadline."""

from __future__ import annotations

import base64
import signal
import uuid
from pathlib import Path

import pytest

from scheduledeventsd.simulator import Simulator
from tests.conftest import DaemonFactory, Hooks, stop_checked, wait_for
from tests.etcd_cluster import Cluster

pytestmark = pytest.mark.xdist_group(name="etcd")
VMS = ("vm-a", "vm-b", "vm-c")


class Tier:
    """One daemon per VM of a group; drain and undrain record when they ran."""

    def __init__(self, tmp_path: Path, sim: Simulator, hooks: Hooks, cluster: Cluster) -> None:
        self.tmp_path, self.sim, self.cluster = tmp_path, sim, cluster
        self.prefix = f"/sed-{uuid.uuid4().hex[:8]}"
        self.factories: dict[str, DaemonFactory] = {}
        self.daemons = {}
        self.out = hooks.out
        stamp = (
            'echo "$SCHEDULED_EVENT_VM_NAME $(date +%s.%N)" >> "$OUT/$SCHEDULED_EVENT_HOOK.log"\n'
        )
        self.drain = hooks.make("drain", f"{stamp}sleep 0.5\n{stamp}")
        self.undrain = hooks.make("undrain", stamp)

    def config(self, vm: str, most: int = 1, ttl: int = 30, **extra):
        factory = self.factories.setdefault(vm, DaemonFactory(self.tmp_path / vm, self.sim))
        (self.tmp_path / vm).mkdir(exist_ok=True)
        return factory.config(
            vm_name=vm,
            approve="always",
            coordination={
                "etcd": {"endpoints": self.cluster.endpoints, "prefix": self.prefix, "timeout": 2}
            },
            concurrency={"group": "web", "max": most, "ttl": ttl},
            hooks={"drain": [{"command": [self.drain]}], "undrain": [{"command": [self.undrain]}]},
            events={"Reboot": {"before": ["drain"], "after": ["undrain"]}},
            **extra,
        )

    def start(self, vm: str, cfg):
        self.daemons[vm] = self.factories[vm].start(cfg)
        return self.daemons[vm]

    def spans(self) -> dict[str, tuple[float, float]]:
        """Per VM: from its drain's start to its undrain's end (the slot must cover this)."""
        starts: dict[str, float] = {}
        ends: dict[str, float] = {}
        for name, table in (("drain", starts), ("undrain", ends)):
            path = self.out / f"{name}.log"
            lines = path.read_text().splitlines() if path.exists() else []
            for line in lines:
                vm, at = line.split()
                if name == "drain":
                    table.setdefault(vm, float(at))
                else:
                    table[vm] = float(at)
        return {vm: (starts[vm], ends[vm]) for vm in starts if vm in ends}

    def stop(self):
        stop_checked(self.factories.values())


@pytest.fixture
def tier(tmp_path, sim, hooks, cluster):
    t = Tier(tmp_path, sim, hooks, cluster)
    yield t
    t.stop()


def overlapping(spans: dict[str, tuple[float, float]]) -> int:
    """The most VMs between hooks-start and after-hooks-end at any instant."""
    edges = sorted([(s, 1) for s, _ in spans.values()] + [(e, -1) for _, e in spans.values()])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def test_one_vm_of_the_group_at_a_time_each_after_the_previous_ones_undrain(tier, sim):
    for vm in VMS:
        tier.start(vm, tier.config(vm))
    events = {vm: sim.add_event("Reboot", [vm], not_before_in=3600) for vm in VMS}
    wait_for(lambda: len(tier.spans()) == 3, 60, "three drains and undrains")
    spans = tier.spans()
    assert overlapping(spans) == 1, spans
    approved = {a.event_id: a.at for a in sim.approvals}
    order = sorted(VMS, key=lambda vm: spans[vm][0])
    for earlier, later in zip(order, order[1:]):
        assert approved[events[later]] > approved[events[earlier]]
        assert spans[later][0] >= spans[earlier][1], "the next drain follows the undrain"
    waited = [r for vm in VMS for r in tier.daemons[vm].logs("event_waiting", reason="slot")]
    assert any(r["holders"] for r in waited), "who holds the slot is said"


def test_max_two_lets_two_through_at_once(tier, sim):
    for vm in VMS:
        tier.start(vm, tier.config(vm, most=2))
    for vm in VMS:
        sim.add_event("Reboot", [vm], not_before_in=3600)
    wait_for(lambda: len(tier.spans()) == 3, 60, "three drains and undrains")
    assert overlapping(tier.spans()) == 2


def test_a_holder_killed_9_frees_its_slot_within_the_ttl(tier, sim):
    """vm-a takes the slot, its daemon is killed mid-drain; vm-b gets it within the TTL."""
    ttl = 6
    a = tier.start("vm-a", tier.config("vm-a", ttl=ttl))
    first = sim.add_event("Reboot", ["vm-a"], not_before_in=3600)
    a.wait_log("slot_acquired", event_id=first)
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(10)
    b = tier.start("vm-b", tier.config("vm-b", ttl=ttl))
    second = sim.add_event("Reboot", ["vm-b"], not_before_in=3600)
    b.wait_log("event_waiting", event_id=second, reason="slot")
    waited = b.wait_log("event_waiting", event_id=second, reason="slot")
    got = b.wait_log("slot_acquired", event_id=second, timeout=ttl + 10)
    assert got["timestamp"] > waited["timestamp"]


def test_without_etcd_nobody_is_approved_early_and_the_hooks_start_at_the_deadline(
    tier, sim, cluster
):
    cluster.kill()
    daemon = tier.start("vm-a", tier.config("vm-a"))
    # The deadline is 10 minutes (WINDOW_LEAD) before NotBefore: here about 5 s from now.
    event_id = sim.add_event("Reboot", ["vm-a"], not_before_in=605)
    daemon.wait_log("slot_failed", event_id=event_id)
    daemon.wait_log("slot_unavailable", event_id=event_id, timeout=15)
    refused = daemon.wait_log("event_not_approved", event_id=event_id)
    assert refused["cause"] == "slot_unavailable"
    assert "vm-a" in (tier.out / "drain.log").read_text(), "prepared all the same"
    daemon.polls_seen(sim)
    assert not sim.approvals


def test_a_daemon_stopped_while_holding_its_slot_keeps_it_for_the_reboot_and_takes_it_back(
    tier, sim, cluster
):
    """SIGTERM (a reboot, most likely): the slot key stays, under a lease of HAND_OVER_TTL;
    the daemon started again takes it back under its own short lease."""
    cfg = tier.config("vm-a", ttl=6)
    cfg["hooks"]["drain"] = [{"command": [tier.drain], "timeout": 60}]
    a = tier.start("vm-a", cfg)
    event_id = sim.add_event("Reboot", ["vm-a"], not_before_in=3600)
    a.wait_log("slot_acquired", event_id=event_id)
    a.wait_log("event_approved", event_id=event_id)
    assert a.stop() == 0
    session = cluster.session()
    endpoint = cluster.endpoints[0]

    def lease_left() -> int:
        prefix = f"{tier.prefix}/slots/web/".encode()
        key = base64.b64encode(prefix + b"0").decode()
        (kv,) = session.post(f"{endpoint}/v3/kv/range", json={"key": key}).json()["kvs"]
        answer = session.post(f"{endpoint}/v3/lease/timetolive", json={"ID": kv["lease"]})
        return int(answer.json()["TTL"])

    assert lease_left() > 600
    again = tier.start("vm-a", cfg)
    # Taken back means put again under the new daemon's own lease (one transaction).
    again.wait_log("slot_acquired", event_id=event_id, taken_back=True)


def test_a_queued_event_whose_status_becomes_unknown_does_not_stop_the_polls(tier, sim, hooks):
    """Issue 26 #16: vm-b's Reboot (`before: []`) waits for the slot vm-a holds; IMDS then lists
    it `Completed` with NotBefore cleared. That document was refused whole and no poll was
    ordered again: a Preempt posted next was never detected. Now the poll goes on and the
    Preempt is seen at once."""
    cfg_a = tier.config("vm-a", shutdown_grace=1)
    cfg_a["hooks"]["drain"] = [{"command": [hooks.make("hold", "exec sleep 300")], "timeout": 600}]
    a = tier.start("vm-a", cfg_a)
    held = sim.add_event("Reboot", ["vm-a"], not_before_in=3600)
    a.wait_log("slot_acquired", event_id=held)
    cfg_b = tier.config("vm-b")
    cfg_b["events"] = {"Reboot": {"before": [], "after": ["undrain"]}, "Preempt": []}
    b = tier.start("vm-b", cfg_b)
    queued = sim.add_event("Reboot", ["vm-b"], not_before_in=3600)
    b.wait_log("event_waiting", event_id=queued, reason="slot")
    sim.update_event(queued, EventStatus="Completed", NotBefore="")
    b.polls_seen(sim, count=8)
    preempt = sim.add_event("Preempt", ["vm-b"], not_before_in=30)
    b.wait_log("event_detected", event_id=preempt, timeout=3)
    assert not tier.factories["vm-b"].defects()
