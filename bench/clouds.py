"""Benchmark: detection latency per cloud, side by side in one run.

Three daemons, each polling once a second against its cloud's simulator: Azure (a GET a
second), AWS (IMDSv2: the spot, scheduled and rebalance notices a second) and Google Cloud (the
instance directory long-polled). Each round posts a notice at a random instant (an Azure
Preempt, an AWS spot instance-action, a Google Cloud preemption) and measures how long until
the Preempt hook starts (the hook writes the time). Reported: p50, p99 and max per cloud, and
the ratio to Azure's.

    python -m bench.clouds            # 30 notices per cloud: about 3 minutes
    python -m bench.clouds --quick    # 5 per cloud (CI)
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from bench import start_daemon
from scheduledeventsd.simulators.aws import AwsSimulator
from scheduledeventsd.simulators.azure import Simulator
from scheduledeventsd.simulators.gcp import GcpSimulator
from scheduledeventsd.simulators.scenario import Scenario

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
HOOK = '#!/bin/sh\ndate +%s.%N >> "$OUT/$SCHEDULED_EVENT_PROVIDER"\n'


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Cloud:
    def __init__(self, name: str, work: Path) -> None:
        self.name = name
        self.work = work
        self.out = work / "out"
        if name == "azure":
            self.sim: Any = Simulator(Scenario(vm_name="vm-bench"), rate_limit=False)
        elif name == "aws":
            self.sim = AwsSimulator()
        else:
            self.sim = GcpSimulator()

    def notice(self) -> None:
        if self.name == "azure":
            self.sim.add_event("Preempt", ["vm-bench"], not_before_in=30)
        elif self.name == "aws":
            self.sim.spot("terminate", in_seconds=120)
        else:
            self.sim.preempt()

    def clear(self) -> None:
        """Between rounds, the notice goes away (so the next is a new event)."""
        if self.name == "azure":
            for event_id in self.sim.event_ids():
                self.sim.remove_event(event_id)
        elif self.name == "aws":
            self.sim.clear_spot()
        else:
            self.sim.preempt(False)

    def hook_times(self) -> list[float]:
        path = self.out / self.name
        return [float(x) for x in path.read_text().split()] if path.exists() else []

    def start(self) -> subprocess.Popen[bytes]:
        self.sim.start()
        self.out.mkdir(parents=True, exist_ok=True)
        hook = self.work / "hook"
        hook.write_text(HOOK)
        hook.chmod(0o755)
        config = self.work / "config.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "provider": self.name,
                    "vm_name": "vm-bench" if self.name == "azure" else None,
                    "metadata": {"url": self.sim.url, "poll_interval": 1},
                    "state_dir": str(self.work / "state"),
                    "approve": "never",
                    "hooks": {"preempt": [{"command": [str(hook)]}]},
                    "events": {"Preempt": ["preempt"]},
                    "environment": {"OUT": str(self.out)},
                }
            )
        )
        return start_daemon(config, self.work / "daemon.log")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    rounds = 5 if args.quick else args.rounds
    rng = random.Random(7)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-clouds-") as tmp:
        clouds = [Cloud(n, Path(tmp) / n) for n in ("azure", "aws", "gcp")]
        for cloud in clouds:
            cloud.work.mkdir()
        procs = [c.start() for c in clouds]
        latencies: dict[str, list[float]] = {c.name: [] for c in clouds}
        try:
            time.sleep(3)
            for _ in range(rounds):
                time.sleep(rng.uniform(0.0, 1.0))  # a random phase against the poll
                posted: dict[str, float] = {}
                before = {c.name: len(c.hook_times()) for c in clouds}

                def post(cloud: Cloud, posted: dict[str, float] = posted) -> None:
                    posted[cloud.name] = time.time()
                    cloud.notice()

                threads = [threading.Thread(target=post, args=(c,)) for c in clouds]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and any(
                    len(c.hook_times()) <= before[c.name] for c in clouds
                ):
                    time.sleep(0.05)
                for c in clouds:
                    times = c.hook_times()
                    if len(times) > before[c.name]:
                        latencies[c.name].append(times[before[c.name]] - posted[c.name])
                for c in clouds:
                    c.clear()
                time.sleep(2.5)  # the notice leaves every daemon's view
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(30)
            for c in clouds:
                c.sim.stop()
    base = statistics.median(latencies["azure"])
    lines = [
        f"detection (notice posted -> hook started), poll_interval 1 s, {rounds} notices each",
        f"{'':<8}{'p50 (s)':>10}{'p99 (s)':>10}{'max (s)':>10}{'p50 / Azure':>14}",
    ]
    summary: dict[str, Any] = {}
    for name, values in latencies.items():
        p50, p99, most = statistics.median(values), pct(values, 0.99), max(values)
        summary[name] = {"p50": p50, "p99": p99, "max": most, "n": len(values)}
        lines.append(f"{name:<8}{p50:>10.3f}{p99:>10.3f}{most:>10.3f}{p50 / base:>14.2f}")
    table = "\n".join(lines)
    print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / ("clouds-quick.json" if args.quick else "clouds.json")).write_text(
        json.dumps(
            {
                "rounds": rounds,
                "elapsed_s": round(time.monotonic() - started, 1),
                "results": summary,
                "table": table,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
