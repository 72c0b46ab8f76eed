"""Built-in scenarios: one VM and one event with Azure's documented timings (the minimum notice
of each event type, Scheduled Events' documentation) and typical observed impact, so
`plan --scenario NAME` answers without a FLEET file. The VM runs `--config`; its hooks take no
time (a FLEET file states their durations)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from . import fleet
from .fleet import Fleet

VM = "vm-1"

SCENARIOS: Mapping[str, tuple[str, Mapping[str, object]]] = {
    "live-migration": (
        "a Freeze: 15 minutes' notice, the VM paused for about 5 s",
        {"type": "Freeze", "notice": "15m", "impact": "5s"},
    ),
    "reboot": (
        "a Reboot: 15 minutes' notice, down for about 5 minutes",
        {"type": "Reboot", "notice": "15m", "impact": "5m"},
    ),
    "redeploy": (
        "a Redeploy: 10 minutes' notice, moved to another host, down for about 10 minutes",
        {"type": "Redeploy", "notice": "10m", "impact": "10m"},
    ),
    "preempt": (
        "a Spot eviction: 30 s notice, gone for good",
        {"type": "Preempt", "notice": "30s"},
    ),
    "terminate": (
        "a scale-set deletion: 5 minutes' notice (the notification's default), gone for good",
        {"type": "Terminate", "notice": "5m"},
    ),
    "canceled": (
        "a Reboot announced with 15 minutes' notice and withdrawn 5 minutes later",
        {"type": "Reboot", "notice": "15m", "impact": "5m", "cancelled": "5m"},
    ),
    "host-failure": (
        "a host failure: redeployed with no notice, down for about 10 minutes",
        {"type": "Redeploy", "notice": "0s", "impact": "10m"},
    ),
}


def load(name: str, config: Path) -> Fleet:
    """The scenario as a fleet of one VM running `config`; ConfigError as for a FLEET file."""
    _, maintenance = SCENARIOS[name]
    raw = {"vms": [{"names": VM}], "maintenance": [{**maintenance, "vms": VM}]}
    return fleet.parse(raw, Path(f"scenario {name}"), config)
