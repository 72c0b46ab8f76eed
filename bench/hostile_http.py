"""The daemon's HTTP edges against hostile peers on loopback, measured (issue 26, #9 and #11):

    python -m bench.hostile_http webhook [--gib 1.5] [--source DIR]
        a webhook receiver answering 200 with a chunked body of --gib GiB: the daemon's VmRSS
        before, its peak (VmHWM) and the time until the message is logged
    python -m bench.hostile_http probes [--idle 20] [--probes 12] [--source DIR]
        --idle clients that connect, send nothing and reconnect the moment they are dropped,
        and --probes GETs of /health 0.25 s apart: how many are answered

--source: the checkout whose daemon is run (another one's, e.g. main's, to compare).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from scheduledeventsd.simulators.azure import Simulator
from scheduledeventsd.simulators.scenario import Scenario
from tests.edges.test_http_edges import Hostile, _Idlers, _probe, _rss_kib
from tests.etcd_cluster import free_ports

ROOT = Path(__file__).resolve().parents[1]
VM = "bench-vm"


class _Daemon:
    """The daemon as a process, its JSON log lines collected."""

    def __init__(self, source: Path, config: dict[str, Any], workdir: Path) -> None:
        path = workdir / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        self.records: list[dict[str, Any]] = []
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(source)}
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "scheduledeventsd", "run", "--config", str(path)),
                *("--log-format", "json", "--log-target", "console"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=source,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.records.append(json.loads(line))

    def wait(self, *names: str, timeout: float) -> str:
        """The first of `names` logged, "" if none is within `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for record in list(self.records):
                if record.get("event") in names:
                    return str(record["event"])
            time.sleep(0.05)
        return ""

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _config(sim: Simulator, workdir: Path, **extra: Any) -> dict[str, Any]:  # noqa: ANN401
    return {
        "metadata": {"url": sim.url, "poll_interval": 0.25, "first_call_timeout": 5},
        "vm_name": VM,
        "state_dir": str(workdir / "state"),
        "hooks": {},
        "events": {"Reboot": []},
        **extra,
    }


def webhook(source: Path, gib: float) -> None:
    scenario = Scenario(vm_name=VM, start_after_approval=0.5, started_for=1.0)
    sim = Simulator(scenario, rate_limit=False)
    sim.start()
    hostile = Hostile(cap=int(gib * (1 << 30)), seconds=300)
    with tempfile.TemporaryDirectory() as tmp:
        hook = {"url": hostile.url("/endless"), "on": ["detected"], "retries": 0}
        daemon = _Daemon(source, _config(sim, Path(tmp), webhooks=[hook]), Path(tmp))
        try:
            daemon.wait("document_changed", timeout=30)
            pid = daemon.proc.pid
            before = _rss_kib(pid)
            started = time.monotonic()
            sim.add_event("Reboot", [VM], not_before_in=600)
            done = daemon.wait("webhook_delivered", "webhook_failed", timeout=600)
            took = time.monotonic() - started
            peak, after = _rss_kib(pid, "VmHWM"), _rss_kib(pid)
            print(
                f"source {source}: reply of {gib:g} GiB, {hostile.sent.get('/endless', 0)} bytes"
                f" sent; VmRSS before {before / 1024:.1f} MiB, peak (VmHWM) {peak / 1024:.1f}"
                f" MiB, after {after / 1024:.1f} MiB; {done or 'nothing logged'} after {took:.1f} s"
            )
        finally:
            daemon.stop()
            hostile.stop()
            sim.stop()


def probes(source: Path, idle: int, count: int) -> None:
    sim = Simulator(Scenario(vm_name=VM), rate_limit=False)
    sim.start()
    (port,) = free_ports(1)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = _config(sim, Path(tmp), http={"listen": f"127.0.0.1:{port}"})
        daemon = _Daemon(source, cfg, Path(tmp))
        idlers = None
        try:
            daemon.wait("document_changed", timeout=30)
            idlers = _Idlers(port, idle)
            time.sleep(1.5)
            answers = []
            for _ in range(count):
                answers.append(_probe(port))
                time.sleep(0.25)
            ok = answers.count("200")
            others = sorted(set(answers) - {"200"})
            print(
                f"source {source}: {idle} idle reconnecting clients ({idlers.connects} connects);"
                f" {ok} of {count} probes answered 200; the others: {others}"
            )
        finally:
            if idlers is not None:
                idlers.stop()
            daemon.stop()
            sim.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("webhook", "probes"))
    parser.add_argument("--source", type=Path, default=ROOT)
    parser.add_argument("--gib", type=float, default=1.5)
    parser.add_argument("--idle", type=int, default=20)
    parser.add_argument("--probes", type=int, default=12)
    args = parser.parse_args()
    if args.what == "webhook":
        webhook(args.source.resolve(), args.gib)
    else:
        probes(args.source.resolve(), args.idle, args.probes)


if __name__ == "__main__":
    main()
