"""What a fleet costs etcd and each daemon: requests and watch events read from the members'
own /metrics, CPU time and RSS read from /proc (bench/fleet.py's (c) figures)."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import requests

from tests.etcd_cluster import Cluster

_SAMPLE = re.compile(r"^(\w+)\{([^}]*)\} ([0-9.e+-]+)$|^(\w+) ([0-9.e+-]+)$")
_METHOD = re.compile(r'grpc_method="(\w+)"')
TICKS = os.sysconf("SC_CLK_TCK")


def etcd_counters(cluster: Cluster) -> Counter[str]:
    """Summed over the members: gRPC calls started per method (the JSON gateway calls its own
    member's gRPC, so every request a daemon makes is one), watch events sent, watchers now."""
    totals: Counter[str] = Counter()
    with requests.Session() as s:
        s.trust_env = False
        for endpoint in cluster.endpoints:
            for line in s.get(f"{endpoint}/metrics", timeout=5).text.splitlines():
                m = _SAMPLE.match(line)
                if m is None:
                    continue
                name = m.group(1) or m.group(4)
                value = float(m.group(3) or m.group(5))
                if name == "grpc_server_started_total":
                    method = _METHOD.search(m.group(2) or "")
                    totals[f"grpc.{method.group(1) if method else '?'}"] += value
                elif name in (
                    "etcd_disk_wal_fsync_duration_seconds_sum",
                    "etcd_disk_wal_fsync_duration_seconds_count",
                ):
                    totals[name.removeprefix("etcd_disk_")] += value
                elif name in (
                    "etcd_debugging_mvcc_events_total",
                    "etcd_debugging_mvcc_watcher_total",
                    "etcd_debugging_mvcc_watch_stream_total",
                ):
                    totals[name.removeprefix("etcd_debugging_mvcc_")] += value
    return totals


def per_vm_event(before: Counter[str], after: Counter[str], vm_events: int) -> dict[str, float]:
    """The counters' growth divided by VMs x events (gauges are left out)."""
    out: dict[str, float] = {}
    fsyncs = after["wal_fsync_duration_seconds_count"] - before["wal_fsync_duration_seconds_count"]
    if fsyncs:
        spent = after["wal_fsync_duration_seconds_sum"] - before["wal_fsync_duration_seconds_sum"]
        out["wal_fsync_ms_mean"] = round(1000 * spent / fsyncs, 2)
    for key in sorted(set(after) | set(before)):
        if key.startswith(("watcher_total", "watch_stream_total", "wal_fsync")):
            continue
        grown = after[key] - before[key]
        if grown:
            out[key] = round(grown / vm_events, 2)
    out["requests"] = round(sum(v for k, v in out.items() if k.startswith("grpc.")), 2)
    return out


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def at_rest(procs: list[subprocess.Popen[bytes]], seconds: float) -> dict[str, Any]:
    """Mean and most CPU (% of one core) and RSS (MB) per daemon over `seconds`."""
    pids = [p.pid for p in procs]
    start = {pid: cpu_seconds(pid) for pid in pids}
    began = time.monotonic()
    time.sleep(seconds)
    spent = time.monotonic() - began
    cpu = [100 * (cpu_seconds(pid) - start[pid]) / spent for pid in pids]
    rss = [rss_mb(pid) for pid in pids]
    return {
        "seconds": round(spent, 1),
        "cpu_pct_mean": round(sum(cpu) / len(cpu), 3),
        "cpu_pct_max": round(max(cpu), 3),
        "cpu_pct_all": round(sum(cpu), 2),
        "rss_mb_mean": round(sum(rss) / len(rss), 1),
        "rss_mb_max": round(max(rss), 1),
    }
