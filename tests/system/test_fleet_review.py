"""A reviewer's attacks on shared events and the hold lease, with a real 3-member etcd, real
daemons and real hooks (tests/system/test_fleet.py's Fleet)."""

from __future__ import annotations

import pytest

from tests.conftest import wait_for
from tests.system.test_fleet import Fleet, approvals, etcd_settings, keys

pytestmark = pytest.mark.xdist_group(name="etcd")


@pytest.fixture
def fleet2(tmp_path, sim, hooks):
    f = Fleet(tmp_path, sim, hooks)
    # The hook sleeps what `$OUT/<vm>.sleep` says when it runs (changed between rounds).
    f.hook = hooks.make(
        "prepare",
        's=$(cat "$OUT/$SCHEDULED_EVENT_VM_NAME.sleep" 2>/dev/null || echo 0)\n'
        'sleep "$s"\n'
        'date +%s.%N > "$OUT/$SCHEDULED_EVENT_VM_NAME.done"\n',
    )
    yield f
    f.stop()


def test_a_shared_event_back_under_its_id_waits_for_every_vms_new_ready(cluster, fleet2, sim):
    """An event that left while vm-b's ready was written and came back under the same EventId
    is approved only once vm-b's hooks ran again: vm-b's ready from before it left is not this
    time's (on main it stayed on vm-b's daemon lease and vm-a approved at once, while vm-b's
    before-hooks still ran)."""
    fleet, out = fleet2, fleet2.hooks.out
    (out / "vm-a.sleep").write_text("30")
    for vm in ("vm-a", "vm-b"):
        fleet.start(vm, fleet.config(vm, etcd_settings(cluster, fleet)))
    event_id = sim.add_event("Reboot", ["vm-a", "vm-b"], not_before_in=600)
    marks = f"{fleet.prefix}/events/{event_id}/"
    wait_for(lambda: "vm-b" in str(keys(cluster, marks)), 15, "vm-b's ready")
    sim.remove_event(event_id)
    for vm in ("vm-a", "vm-b"):
        fleet.daemons[vm].wait_log("event_cancelled", timeout=10)
    (out / "vm-a.sleep").write_text("0")
    (out / "vm-b.sleep").write_text("6")
    (out / "vm-b.done").unlink()
    sim.add_event("Reboot", ["vm-a", "vm-b"], event_id=event_id, not_before_in=600)
    wait_for(lambda: approvals(sim, event_id), 20, "the approval")
    done = out / "vm-b.done"
    assert done.exists(), "approved while vm-b's before-hooks still ran"
    assert min(a.at for a in approvals(sim, event_id)) >= float(done.read_text())
