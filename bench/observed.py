"""Benchmark: what watching costs at rest. Two daemons side by side, each with its own simulator
and no events: one plain, one with `http.listen` and `metrics_textfile` on and /metrics and
/health scraped every 15 s (a Prometheus and a load balancer). Reports CPU (% of a core) and RSS
of each, and the difference. Target: no more than +0.05 % of a core and +5 MB.

    python -m bench.observed            # 5 minutes at rest
    python -m bench.observed --quick    # 30 s (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

from bench import start_daemon
from scheduledeventsd.simulators.azure import Simulator
from scheduledeventsd.simulators.scenario import Scenario
from tests.etcd_cluster import free_ports

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
TICK = os.sysconf("SC_CLK_TCK")


def usage(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) and RSS in MB of a process."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    rss = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    return (int(stat[11]) + int(stat[12])) / TICK, rss / 1024


def start(
    name: str, work: Path, extra: dict[str, object]
) -> tuple[subprocess.Popen[bytes], Simulator]:
    sim = Simulator(Scenario(vm_name="bench-vm"))
    sim.start()
    config = work / f"{name}.yaml"
    config.write_text(
        json.dumps(
            {
                "metadata": {"url": sim.url, "poll_interval": 1},
                "vm_name": "bench-vm",
                "state_dir": str(work / name),
                "hooks": {},
                "events": {},
                **extra,
            }
        )
    )
    proc = start_daemon(config, work / f"{name}.log")
    return proc, sim


def scraper(port: int, every: float, stop: threading.Event) -> None:
    with requests.Session() as s:
        s.trust_env = False
        while not stop.wait(every):
            s.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
            s.get(f"http://127.0.0.1:{port}/health", timeout=5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seconds", type=float, help="time at rest (default 300, quick 30)")
    args = parser.parse_args()
    rest = 30.0 if args.quick else 300.0
    if args.seconds:
        rest = args.seconds
    (port,) = free_ports(1)
    with tempfile.TemporaryDirectory(prefix="sed-observed-bench-") as tmp:
        work = Path(tmp)
        (work / "textfile").mkdir()
        observed = {
            "http": {"listen": f"127.0.0.1:{port}"},
            "metrics_textfile": str(work / "textfile" / "scheduledeventsd.prom"),
        }
        plain_proc, plain_sim = start("plain", work, {})
        seen_proc, seen_sim = start("observed", work, observed)
        stop = threading.Event()
        try:
            time.sleep(5)  # past start-up and the first polls
            threading.Thread(target=scraper, args=(port, 15.0, stop), daemon=True).start()
            before = {n: usage(p.pid) for n, p in (("plain", plain_proc), ("observed", seen_proc))}
            time.sleep(rest)
            after = {n: usage(p.pid) for n, p in (("plain", plain_proc), ("observed", seen_proc))}
        finally:
            stop.set()
            for proc in (plain_proc, seen_proc):
                proc.terminate()
                proc.wait(15)
            plain_sim.stop()
            seen_sim.stop()
    results = {
        name: {
            "cpu_percent_of_core": 100 * (after[name][0] - before[name][0]) / rest,
            "rss_mb": after[name][1],
        }
        for name in after
    }
    plain, seen = results["plain"], results["observed"]
    cpu_delta = seen["cpu_percent_of_core"] - plain["cpu_percent_of_core"]
    rss_delta = seen["rss_mb"] - plain["rss_mb"]
    print(f"{rest:.0f} s at rest, scraped every 15 s; CPU resolution {100 / TICK / rest:.3f} %")
    print(f"{'':<10}{'CPU % of a core':>16}{'RSS MB':>10}")
    for name, r in results.items():
        print(f"{name:<10}{r['cpu_percent_of_core']:>16.3f}{r['rss_mb']:>10.1f}")
    print(f"{'observed - plain':<10}{cpu_delta:>10.3f}{rss_delta:>10.1f}")
    print(
        f"targets: +0.05 % of a core: {'met' if cpu_delta <= 0.05 else 'MISSED'}; "
        f"+5 MB: {'met' if rss_delta <= 5 else 'MISSED'}"
    )
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = RESULTS / f"observed-{'quick' if args.quick else 'full'}-{stamp}.json"
    out.write_text(json.dumps({"rest_s": rest, "results": results}, indent=2))
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
