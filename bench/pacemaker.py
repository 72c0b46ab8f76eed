"""Benchmark: a Pacemaker node's drain, from the event seen to the resources gone to approval.

A real 3-node cluster (tests/pacemaker_cluster.py) with four Dummy resources (start and stop take
`op_sleep` = 1 s), two of them preferring node1 (score 100, so they come back once it is
restored). The daemon runs inside node1; the simulator in the cluster's hub network. Each round
posts a Preempt (30 s notice) for node1 and measures, from the instant it was added:

- `seen_s`: the daemon's first poll that lists it (the simulator's next GET after the add);
- `gone_s`: the first reading, from node2 every 0.1 s, in which nothing runs on node1;
- `approved_s`: the approval POST (after the drain is confirmed and the before-hook ran).

Side by side: `method: health` and `method: standby`, in one run; the ratio is standby/health.

    python -m bench.pacemaker            # 10 rounds each: about 3 minutes
    python -m bench.pacemaker --quick    # 2 rounds each (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

import yaml

from bench import stop_daemon
from scheduledeventsd.simulators.azure import Simulator
from scheduledeventsd.simulators.scenario import Scenario
from tests.pacemaker_cluster import HUB_ADDRESS, Cluster, in_netns, missing, tag

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
RESOURCES = ("d1", "d2", "d3", "d4")
PREFERRED = ("d1", "d2")  # prefer node1, so every round starts with work on it
METHODS = ("health", "standby")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def prepare(cluster: Cluster) -> None:
    cluster.add_dummies(len(RESOURCES), op_sleep=1)
    via = cluster.nodes[0]
    for rid in PREFERRED:
        rule = f'<rsc_location id="prefer-{rid}" rsc="{rid}" node="node1" score="100"/>'
        via.run("cibadmin", "--create", "-o", "constraints", "--xml-text", rule)
    cluster.wait("resources on node1", lambda: on_node1(cluster) == set(PREFERRED), 90)


def on_node1(cluster: Cluster) -> set[str]:
    return {r for r in RESOURCES if "node1" in cluster.where(r, via=cluster.nodes[1])}


def watch_gone(cluster: Cluster, stop: threading.Event, since: float, out: list[float]) -> None:
    while not stop.is_set():
        if not on_node1(cluster):
            out.append(time.time() - since)
            return
        stop.wait(0.1)


def run_method(
    cluster: Cluster, sim: Simulator, work: Path, method: str, rounds: int
) -> dict[str, Any]:
    node1 = cluster.node("node1")
    hook = work / "before"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    config = work / f"{method}.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "metadata": {"url": sim.url, "poll_interval": 1.0},
                "vm_name": "node1",
                "state_dir": str(work / f"state-{method}"),
                "approve": "always",
                "hooks": {"before": [{"command": [str(hook)]}]},
                "events": {"Preempt": ["before"]},
                "cluster": {"pacemaker": {"method": method}},
            }
        )
    )
    log = (work / f"{method}.log").open("ab")
    daemon = subprocess.Popen(
        [*node1.argv(), sys.executable, "-m", "scheduledeventsd", "run", "--config", str(config),
         "--log-target", "console", "--log-level", "warning"],
        cwd=ROOT, env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)},
        stdin=subprocess.DEVNULL, stdout=log, stderr=log,
    )  # fmt: skip
    rows: list[dict[str, Optional[float]]] = []
    try:
        cluster.wait("the daemon polling", lambda: sim.gets() > 2, 30)
        for _ in range(rounds):
            cluster.wait("resources back on node1", lambda: on_node1(cluster) == set(PREFERRED), 90)
            time.sleep(1)
            added = time.time()
            event_id = sim.add_event("Preempt", ["node1"], not_before_in=30)
            gone: list[float] = []
            stop = threading.Event()
            watcher = threading.Thread(target=watch_gone, args=(cluster, stop, added, gone))
            watcher.start()
            cluster.wait(
                "the approval", lambda e=event_id: any(a.event_id == e for a in sim.approvals), 60
            )
            approved = next(a.at for a in sim.approvals if a.event_id == event_id) - added
            stop.set()
            watcher.join()
            polls = [r.wall - added for r in list(sim.requests) if r.method == "GET"]
            seen = min((p for p in polls if p >= 0), default=None)
            rows.append(
                {"seen_s": seen, "gone_s": gone[0] if gone else None, "approved_s": approved}
            )
            cluster.wait("the event over", lambda e=event_id: e not in sim.event_ids(), 30)
    finally:
        stop_daemon(daemon, 30)
    gone_all = [r["gone_s"] for r in rows if r["gone_s"] is not None]
    approved_all = [r["approved_s"] for r in rows if r["approved_s"] is not None]
    return {
        "rounds": rows,
        "gone_s": {"p50": statistics.median(gone_all), "max": max(gone_all)},
        "approved_s": {"p50": statistics.median(approved_all), "max": max(approved_all)},
        "confirm_s_p50": statistics.median(
            [
                r["approved_s"] - r["gone_s"]
                for r in rows
                if r["gone_s"] is not None and r["approved_s"] is not None
            ]
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="2 rounds per method (CI)")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    why = missing()
    if why is not None:
        print(f"bench.pacemaker: a cluster cannot run here: {why}", file=sys.stderr)
        return 1
    rounds = 2 if args.quick else args.rounds
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-pacemaker-") as tmp:
        work = Path(tmp)
        cluster = Cluster(work / "cluster", tag())
        sim = Simulator(Scenario(vm_name="node1", start_after_approval=0.5, started_for=1.0))
        try:
            cluster.create()
            cluster.wait_online([n.name for n in cluster.nodes])
            prepare(cluster)
            in_netns(cluster.hub, lambda: sim.start(HUB_ADDRESS, 0))
            results = {m: run_method(cluster, sim, work, m, rounds) for m in METHODS}
        finally:
            sim.stop()
            cluster.destroy()
    health, standby = results["health"], results["standby"]
    seen = [r["seen_s"] for m in results.values() for r in m["rounds"] if r["seen_s"] is not None]
    lines = [
        f"Pacemaker drain, Preempt for node1 (2 Dummy resources there, op_sleep 1 s), "
        f"{rounds} rounds each, poll 1 s",
        f"{'':<34}{'health':>10}{'standby':>10}{'standby/health':>16}",
    ]
    for label, key in (("resources gone p50 (s)", "gone_s"), ("approved p50 (s)", "approved_s")):
        h, s = health[key]["p50"], standby[key]["p50"]
        lines.append(f"{label:<34}{h:>10.2f}{s:>10.2f}{s / h:>16.2f}")
    for label, key in (("resources gone max (s)", "gone_s"), ("approved max (s)", "approved_s")):
        h, s = health[key]["max"], standby[key]["max"]
        lines.append(f"{label:<34}{h:>10.2f}{s:>10.2f}{s / h:>16.2f}")
    h, s = health["confirm_s_p50"], standby["confirm_s_p50"]
    lines.append(f"{'gone -> approved p50 (s)':<34}{h:>10.2f}{s:>10.2f}{s / h:>16.2f}")
    lines.append(f"(seen: the poll that listed it, p50 {statistics.median(seen):.2f} s)")
    table = "\n".join(lines)
    print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / ("pacemaker-quick.json" if args.quick else "pacemaker.json")
    out.write_text(
        json.dumps(
            {
                "rounds": rounds,
                "elapsed_s": round(time.monotonic() - started, 1),
                "results": results,
                "table": table,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
