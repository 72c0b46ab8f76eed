"""The plan agrees with reality (issue 30): the same small fleet, planned and run. Three real
daemons of one concurrency group (`max: 1`) on a real 3-member etcd and the IMDS simulator, each
with a Reboot of its own and an hour's notice, drain hooks that take what FLEET.yaml says; then
`plan` over the same configs. The k-th VM to start its drain, the k-th approval and the k-th
after-hooks agree within 2 s (which VM wins the slot first is etcd's race: only the instants
are compared). The tests' simulator starts an approved event after 0.5 s and lists it Started
for 1 s: the plan's `impact: 1.5s`. The test that keeps the planner's simulated parts honest."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pytest

from scheduledeventsd.plan import fleet, report, run
from tests.conftest import wait_for
from tests.system.test_slots import VMS, Tier

pytestmark = pytest.mark.xdist_group(name="etcd")
TOLERANCE = 2.0


@pytest.fixture
def tier(tmp_path, sim, hooks, cluster):
    t = Tier(tmp_path, sim, hooks, cluster)
    yield t
    t.stop()


def offsets(instants: list[float], t0: float) -> list[float]:
    return sorted(round(t - t0, 2) for t in instants)


def test_the_plan_agrees_with_three_real_daemons_sharing_one_slot(tier, sim, tmp_path):
    configs = {}
    for vm in VMS:
        cfg = tier.config(vm)
        tier.start(vm, cfg)
        configs[vm] = tier.factories[vm].write_config(cfg, "planned.yaml")
    t0 = time.time()
    events = {vm: sim.add_event("Reboot", [vm], not_before_in=3600) for vm in VMS}
    wait_for(lambda: len(tier.spans()) == len(VMS), 60, "three drains and undrains")
    spans = tier.spans()
    approved = {a.event_id: a.at for a in sim.approvals}
    real = {
        "drain": offsets([spans[vm][0] for vm in VMS], t0),
        "approved": offsets([approved[events[vm]] for vm in VMS], t0),
        "undrain": offsets([spans[vm][1] for vm in VMS], t0),
    }

    entries = "".join(
        f"  - names: {vm}\n    config: {configs[vm]}\n    hooks: {{drain: 0.5s}}\n" for vm in VMS
    )
    text = (
        f"vms:\n{entries}maintenance:\n  - type: Reboot\n    vms: [{', '.join(VMS)}]\n"
        "    notice: 1h\n    impact: 1.5s\n"
    )
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    start = dt.datetime.fromtimestamp(t0, dt.timezone.utc)
    data = report.build(run.Plan(fleet.load(path, Path("/absent.yaml")), start).run())

    def planned(key: str) -> list[float]:
        return sorted(
            round((dt.datetime.fromisoformat(r[key][:-1] + "+00:00") - start).total_seconds(), 2)
            for r in data["rows"]
        )

    plan = {
        "drain": planned("hooks_start"),
        "approved": planned("approved"),
        "undrain": planned("after_done"),
    }
    for key, seen in real.items():
        apart = [abs(a - b) for a, b in zip(seen, plan[key])]
        assert max(apart) <= TOLERANCE, (key, real, plan)
    assert data["summary"]["groups"][0]["most_at_once"] == 1
    assert all(r["approved_early"] for r in data["rows"])
