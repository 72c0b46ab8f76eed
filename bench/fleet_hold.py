"""What one slot held through a reboot costs etcd, measured (bench/fleet.py `--reboot`): one
daemon (`max: 1`, the default ttl and hold_max) takes its slot for a Reboot, is approved, is
stopped as for the reboot (its slot held through), starts again on a new boot (a boot id of
its own, bind-mounted: needs root), runs its after-hooks and gives the slot back. The
members' gRPC counters diffed around the whole of it, per method: every request a daemon
makes through the JSON gateway is one (bench/fleet_load.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import requests

from bench import daemon_command, stop_daemon
from bench.fleet_load import etcd_counters, per_vm_event
from scheduledeventsd.simulators.azure import Simulator
from scheduledeventsd.simulators.scenario import Scenario
from tests.etcd_cluster import Cluster

UNSHARE = shutil.which("unshare") or "/usr/bin/unshare"
HOOK = """#!/bin/sh
date +%s.%N > "$OUT/$SCHEDULED_EVENT_HOOK.$SCHEDULED_EVENT_VM_NAME"
"""


def _until(what: str, done: Callable[[], object], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"reboot hold: timed out waiting for {what}")
        time.sleep(0.1)


def _leases(cluster: Cluster) -> set[str]:
    with requests.Session() as session:
        session.trust_env = False
        found = session.post(f"{cluster.endpoints[0]}/v3/lease/leases", json={}, timeout=5)
        return {lease["ID"] for lease in found.json().get("leases", [])}


def reboot_hold(name: str, work: Path, cluster: Cluster, tree: Path) -> dict[str, Any]:
    """The daemon of `tree` through approval -> stop -> restart on a new boot -> after-hooks
    -> release; etcd's requests for it, per method (keep-alives included: LeaseKeepAlive)."""
    if os.geteuid() != 0:
        return {"skipped": "a boot id of its own needs root (a bind mount)"}
    sim = Simulator(
        Scenario(vm_name="vm-0", start_after_approval=2.0, started_for=0.5), rate_limit=False
    )
    sim.start()
    work.mkdir(parents=True)
    out = work / "out"
    out.mkdir()
    hook = work / "hook"
    hook.write_text(HOOK)
    hook.chmod(0o755)
    boot = work / "boot_id"
    boot.write_text(f"{uuid.uuid4()}\n")
    config = work / "vm-0.yaml"
    config.write_text(
        json.dumps(
            {
                "metadata": {"url": sim.url, "poll_interval": 1},
                "vm_name": "vm-0",
                "state_dir": str(work / "state"),
                "approve": "always",
                "coordination": {"etcd": {"endpoints": cluster.endpoints, "prefix": f"/{name}"}},
                "concurrency": {"group": "g", "max": 1},
                "hooks": {
                    "drain": [{"command": [str(hook)]}],
                    "undrain": [{"command": [str(hook)]}],
                },
                "events": {"Reboot": {"before": ["drain"], "after": ["undrain"]}},
                "environment": {"OUT": str(out)},
            }
        )
    )
    mount = f'mount --bind {boot} /proc/sys/kernel/random/boot_id && exec "$@"'

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [UNSHARE, "-m", "sh", "-c", mount, "sh", *daemon_command(config)],
            cwd=tree,
            env={"PATH": os.environ["PATH"], "PYTHONPATH": str(tree)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=(work / "daemon.log").open("ab"),
        )

    proc = start()
    try:
        gets = sim.gets()
        _until("the daemon's polls", lambda: sim.gets() - gets >= 3)
        earlier = _leases(cluster)  # another run's, left to expire
        before = etcd_counters(cluster)
        began = time.monotonic()
        event_id = sim.add_event("Reboot", ["vm-0"], not_before_in=3600)
        _until("the approval", lambda: sim.approved(event_id))
        time.sleep(0.5)  # held through: the slot on hold_max at the approval
        proc.terminate()  # its reboot: a clean stop, the slot held
        proc.wait(30)
        _until("the event over", lambda: event_id not in sim.event_ids())
        boot.write_text(f"{uuid.uuid4()}\n")
        proc = start()
        _until("the undrain", (out / "undrain.vm-0").exists)
        time.sleep(2)  # the release (and the lease's swap back)
        after = etcd_counters(cluster)
        took = time.monotonic() - began
        leases = len(_leases(cluster) - earlier)
    finally:
        stop_daemon(proc, 15)
        sim.stop()
    # leases: granted during the run and still in etcd once the slot was given back (the
    # live daemon's: one)
    return {"seconds": round(took, 1), "leases": leases, "etcd": per_vm_event(before, after, 1)}
