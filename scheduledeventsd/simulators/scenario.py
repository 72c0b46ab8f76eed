"""A scenario: what the Azure simulator plays on a timeline (events added, updated, removed,
faults), read from a YAML file (`scheduledeventsd simulate --scenario`, `make demo`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml


@dataclass
class Step:
    at: float
    action: str  # add | update | remove | fault
    value: Any


@dataclass
class Scenario:
    vm_name: str = "sim-vm"
    incarnation: int = 1
    start_after_approval: float = 1.0
    started_for: Optional[float] = 3.0
    duration: Optional[float] = None
    steps: list[Step] = field(default_factory=list)


class ScenarioError(ValueError):
    pass


_SCENARIO_KEYS = (
    "vm_name",
    "incarnation",
    "start_after_approval",
    "started_for",
    "duration",
    "steps",
)
_STEP_ACTIONS = ("add", "update", "remove", "fault")


def load_scenario(path: Path) -> Scenario:
    """Read a scenario file; errors name the file and the step."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ScenarioError(f"{path}: {e}") from None
    if not isinstance(raw, dict):
        raise ScenarioError(f"{path}: must be a mapping")
    unknown = set(raw) - set(_SCENARIO_KEYS)
    if unknown:
        raise ScenarioError(f"{path}: unknown keys: {', '.join(sorted(map(str, unknown)))}")
    steps = []
    for i, entry in enumerate(raw.get("steps") or []):
        actions = [k for k in _STEP_ACTIONS if isinstance(entry, dict) and k in entry]
        if (
            not isinstance(entry, dict)
            or len(actions) != 1
            or not isinstance(entry.get("at"), (int, float))
        ):
            raise ScenarioError(
                f"{path}: steps[{i}]: needs `at` (seconds) and one of {', '.join(_STEP_ACTIONS)}"
            )
        steps.append(Step(float(entry["at"]), actions[0], entry[actions[0]]))
    d = Scenario()
    return Scenario(
        vm_name=str(raw.get("vm_name", d.vm_name)),
        incarnation=int(raw.get("incarnation", d.incarnation)),
        start_after_approval=float(raw.get("start_after_approval", d.start_after_approval)),
        # `started_for: null` keeps Started events in the document until a step removes them.
        started_for=float(raw["started_for"])
        if raw.get("started_for") is not None
        else (None if "started_for" in raw else d.started_for),
        duration=None if raw.get("duration") is None else float(raw["duration"]),
        steps=steps,
    )


def bundled_scenario(name: str) -> Path:
    return Path(__file__).with_name("scenarios") / f"{name}.yaml"
