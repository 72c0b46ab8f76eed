"""Soak: the daemon at a document that changes every second (50 other events, one of ours
every 5 s), with metrics, /health and webhooks on, for an hour (`make soak`) or two minutes
(every test run). Samples RSS, open file descriptors and threads; at the end, every event of
ours must have run its hooks exactly once and been approved.

    python -m tests.soak --seconds 3600
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests

from bench import start_daemon
from scheduledeventsd.simulators.azure import Simulator
from scheduledeventsd.simulators.scenario import Scenario
from tests.etcd_cluster import free_ports

VM = "soak-vm"
ROOT = Path(__file__).resolve().parents[1]
HOOK = '#!/bin/sh\necho "$SCHEDULED_EVENT_ID" >> "$SOAK_LOG"\n'


@dataclass
class Sample:
    at: float
    rss_mb: float
    fds: int
    threads: int


@dataclass
class Result:
    seconds: float
    samples: list[Sample] = field(default_factory=list)
    ours: list[str] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)
    doubled: list[str] = field(default_factory=list)
    webhooks: int = 0
    scrapes: int = 0

    def slope(self, attribute: str) -> float:
        """Least-squares growth per hour over the second half (after warming up)."""
        half = self.samples[len(self.samples) // 2 :]
        if len(half) < 3:
            return 0.0
        xs = [s.at for s in half]
        ys = [float(getattr(s, attribute)) for s in half]
        return statistics.linear_regression(xs, ys).slope * 3600

    def summary(self) -> dict[str, Any]:
        first, last = self.samples[0], self.samples[-1]
        return {
            "seconds": round(self.seconds),
            "events of ours": len(self.ours),
            "missed": len(self.missed),
            "handled twice": len(self.doubled),
            "webhooks received": self.webhooks,
            "scrapes": self.scrapes,
            "rss_mb first/last": [round(first.rss_mb, 1), round(last.rss_mb, 1)],
            "rss slope MB/hour (second half)": round(self.slope("rss_mb"), 2),
            "fds first/last": [first.fds, last.fds],
            "threads first/last": [first.threads, last.threads],
        }


def sample(pid: int) -> Sample:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    value = {k: v.split()[0] for k, _, v in (line.partition(":") for line in status) if v.strip()}
    return Sample(
        time.monotonic(),
        int(value["VmRSS"]) / 1024,
        len(os.listdir(f"/proc/{pid}/fd")),
        int(value["Threads"]),
    )


class _Receiver(BaseHTTPRequestHandler):
    count = 0

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).count += 1
        self.send_response(204)
        self.end_headers()


def soak(seconds: float, work: Path, every: float = 10.0) -> Result:
    sim = Simulator(Scenario(vm_name=VM, start_after_approval=0.3, started_for=0.5))
    sim.start()
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    log = work / "hooks.log"
    hook = work / "hook"
    hook.write_text(HOOK)
    hook.chmod(0o755)
    (port,) = free_ports(1)
    config = work / "config.json"
    config.write_text(
        json.dumps(
            {
                "metadata": {"url": sim.url, "poll_interval": 1},
                "vm_name": VM,
                "state_dir": str(work / "state"),
                "hooks": {"h": [{"command": [str(hook)]}]},
                "events": {"Freeze": ["h"], "Reboot": ["h"]},
                "environment": {"SOAK_LOG": str(log)},
                "http": {"listen": f"127.0.0.1:{port}"},
                "metrics_textfile": str(work / "soak.prom"),
                "webhooks": [
                    {"url": f"http://127.0.0.1:{receiver.server_address[1]}/x", "on": ["approved"]}
                ],
            }
        )
    )
    proc = start_daemon(config, work / "daemon.log")
    result = Result(seconds)
    http = requests.Session()
    http.trust_env = False
    try:
        time.sleep(3)
        others = sim.add_many([{"Resources": [f"other-{i}"]} for i in range(50)])
        began = next_sample = time.monotonic()
        tick = began
        second = 0
        while time.monotonic() - began < seconds:
            sim.remove_event(others.pop(0))
            others.append(sim.add_from_spec({"Resources": [f"other-x{second}"]}))
            if second % 5 == 0:
                result.ours.append(sim.add_from_spec({"EventType": "Freeze", "Resources": [VM]}))
            if second % 15 == 0:
                http.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
                http.get(f"http://127.0.0.1:{port}/health", timeout=5)
                result.scrapes += 1
            if time.monotonic() >= next_sample:
                result.samples.append(sample(proc.pid))
                next_sample += every
            second += 1
            tick += 1.0
            time.sleep(max(0.0, tick - time.monotonic()))
        time.sleep(5)  # the last events of ours are approved and over
        result.samples.append(sample(proc.pid))
    finally:
        proc.terminate()
        proc.wait(30)
        sim.stop()
        receiver.shutdown()
    runs = log.read_text().split() if log.exists() else []
    approved = {a.event_id for a in sim.approvals}
    result.missed = [e for e in result.ours[:-2] if e not in approved]
    result.doubled = [e for e in set(runs) if runs.count(e) > 1]
    result.webhooks = _Receiver.count
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3600)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sed-soak-") as tmp:
        result = soak(args.seconds, Path(tmp), every=10.0)
    print(json.dumps(result.summary(), indent=2))
    return 1 if result.missed or result.doubled else 0


if __name__ == "__main__":
    sys.exit(main())
