"""Benchmark: shared-event approval latency, through etcd and through a gate, side by side.

N daemons (vm-0 .. vm-N-1) poll one simulator serving a Reboot that names all of them; each runs
a hook of a random length. Measured per event: from the end of the last VM's hook, and (etcd)
from the last `ready` written to etcd, to the first approval POST the simulator receives. The
contenders: `approve: all` through a real 3-member etcd cluster (a watch), and through a gate
command that marks this VM ready in a shared directory and answers 0 once every VM named is
(75 until then, asked every second). Either way the last VM to get ready finds the others
ready at once, so both measure the daemon's own path: the write and read (etcd) or the
process start (gate), then the POST.

    python -m bench.fleet            # 3 and 20 daemons, 20 events each: about 6 minutes
    python -m bench.fleet --quick    # 3 daemons, 3 events each: under a minute (CI)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from bench import start_daemon
from scheduledeventsd.config import Etcd
from scheduledeventsd.coordination.etcd import EtcdClient
from scheduledeventsd.simulators.azure import Simulator
from scheduledeventsd.simulators.scenario import Scenario
from tests.etcd_cluster import Cluster

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
HOOK = """#!/bin/sh
sleep "$(shuf -i 0-150 -n 1 | awk '{ print $1 / 100 }')"
date +%s.%N > "$OUT/$SCHEDULED_EVENT_ID.$SCHEDULED_EVENT_VM_NAME"
"""
GATE = """#!/bin/sh
touch "$OUT/$SCHEDULED_EVENT_ID.ready.$SCHEDULED_EVENT_VM_NAME"
for vm in $SCHEDULED_EVENT_RESOURCES; do
    [ -e "$OUT/$SCHEDULED_EVENT_ID.ready.$vm" ] || exit 75
done
exit 0
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Contender:
    def __init__(
        self,
        name: str,
        work: Path,
        sim: Simulator,
        count: int,
        coordination: Callable[[Contender], dict[str, Any]],
    ) -> None:
        self.name = name
        self.work = work
        self.sim = sim
        self.vms = [f"vm-{i}" for i in range(count)]
        self.out = work / "out"
        self.out.mkdir(parents=True)
        hook = self._script("hook", HOOK)
        self.procs: list[subprocess.Popen[bytes]] = []
        for vm in self.vms:
            config = work / f"{vm}.yaml"
            config.write_text(
                json.dumps(
                    {
                        "metadata": {"url": sim.url, "poll_interval": 1},
                        "vm_name": vm,
                        "state_dir": str(work / vm),
                        "approve": "all",
                        "coordination": coordination(self),
                        "hooks": {"prepare": [{"command": [hook]}]},
                        "events": {"Reboot": ["prepare"]},
                        "environment": {"OUT": str(self.out)},
                    }
                )
            )
            self.procs.append(start_daemon(config, work / f"{vm}.log"))

    def _script(self, name: str, body: str) -> str:
        path = self.work / name
        path.write_text(body)
        path.chmod(0o755)
        return str(path)

    def gate(self) -> dict[str, Any]:
        return {"gate": {"command": [self._script("gate", GATE)], "interval": 1}}

    def round(self, timeout: float = 60) -> dict[str, float]:
        """One shared event: seconds from the last hook end (and last ready) to the POST."""
        event_id = self.sim.add_event("Reboot", list(self.vms), not_before_in=900)
        deadline = time.monotonic() + timeout
        while not [a for a in self.sim.approvals if a.event_id == event_id]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: {event_id} not approved in {timeout} s")
            time.sleep(0.01)
        posted = min(a.at for a in self.sim.approvals if a.event_id == event_id)
        ends = [float((self.out / f"{event_id}.{vm}").read_text()) for vm in self.vms]
        while event_id in self.sim.event_ids():
            time.sleep(0.05)
        return {"hook_end": posted - max(ends)}

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


def last_ready(cluster: Cluster, prefix: str, event_id: str) -> float:
    """When the last VM wrote its ready, from the keys themselves (read with the daemon's
    own etcd client)."""
    client = EtcdClient(Etcd(endpoints=tuple(cluster.endpoints), prefix=prefix))
    try:
        _, kvs = client.range(f"{prefix}/events/{event_id}/")
    finally:
        client.close()
    stamps = [json.loads(kv.value or b"{}")["at"] for kv in kvs]
    return max(
        dt.datetime.strptime(at, "%Y-%m-%dT%H:%M:%S.%fZ")
        .replace(tzinfo=dt.timezone.utc)
        .timestamp()
        for at in stamps
    )


def measure(name: str, count: int, rounds: int, root: Path, cluster: Cluster) -> dict[str, Any]:
    sim = Simulator(
        Scenario(vm_name="vm-0", start_after_approval=0.2, started_for=0.3), rate_limit=False
    )
    sim.start()
    prefix = f"/bench-{name}-{count}"
    work = root / f"{name}-{count}"
    work.mkdir()
    etcd = {"etcd": {"endpoints": cluster.endpoints, "prefix": prefix}}
    contender = Contender(
        name, work, sim, count, (lambda c: etcd) if name == "etcd" else Contender.gate
    )
    try:
        time.sleep(2 + count * 0.15)  # every daemon started and polling
        hook_end: list[float] = []
        ready: list[float] = []
        for _ in range(rounds):
            event_id_before = set(sim.event_ids())
            result = contender.round()
            hook_end.append(result["hook_end"])
            if name == "etcd":
                event_id = next(
                    a.event_id for a in reversed(sim.approvals) if a.event_id not in event_id_before
                )
                posted = min(a.at for a in sim.approvals if a.event_id == event_id)
                ready.append(posted - last_ready(cluster, prefix, event_id))
    finally:
        contender.stop()
        sim.stop()
    summary: dict[str, Any] = {
        "daemons": count,
        "events": rounds,
        "hook_end_to_post_s": {
            "p50": statistics.median(hook_end),
            "p99": pct(hook_end, 0.99),
            "max": max(hook_end),
        },
    }
    if ready:
        summary["last_ready_to_post_s"] = {
            "p50": statistics.median(ready),
            "p99": pct(ready, 0.99),
            "max": max(ready),
        }
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    sizes = [3] if args.quick else [3, 20]
    rounds = 3 if args.quick else 20
    random.seed(1)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="sed-fleet-bench-") as tmp:
        root = Path(tmp)
        with Cluster(root / "etcd") as cluster:
            for count in sizes:
                for name in ("etcd", "gate"):
                    results[f"{name}-{count}"] = measure(name, count, rounds, root, cluster)
    lines = [
        "contender  daemons events  hook end -> POST p50/p99/max (ms)  last ready -> POST p50/p99",
    ]
    for key, r in results.items():
        h = {k: v * 1000 for k, v in r["hook_end_to_post_s"].items()}
        row = (
            f"{key.split('-')[0]:<10} {r['daemons']:>7} {r['events']:>6}  "
            f"{h['p50']:10.1f} / {h['p99']:5.1f} / {h['max']:5.1f}"
        )
        if "last_ready_to_post_s" in r:
            lr = {k: v * 1000 for k, v in r["last_ready_to_post_s"].items()}
            row += f"        {lr['p50']:6.1f} / {lr['p99']:5.1f}"
        lines.append(row)
    for count in sizes:
        e, g = results[f"etcd-{count}"], results[f"gate-{count}"]
        ratio = e["hook_end_to_post_s"]["p50"] / max(g["hook_end_to_post_s"]["p50"], 1e-6)
        lines.append(f"{count} daemons: etcd / gate (p50, hook end -> POST) = {ratio:.2f}")
    print("\n".join(lines))
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = RESULTS / f"fleet-{'quick' if args.quick else 'full'}-{stamp}.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
