"""FLEET.yaml: the VMs of a fleet (each with the daemon config it runs and how long its hooks
take) and the maintenance the cloud will announce, checked into frozen dataclasses.

Every problem is named by its file and key path, as `check-config` names a config's (the same
Checker and ConfigError, the same YAML loader), and all of them are told in one run. Each VM's
config is read as the daemon reads it, less the look at its hook files: they are on the VMs,
not on the machine that plans.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from ..config import Config, ConfigError, loader
from ..config.walker import Checker, kind_of
from ..model import EVENT_TYPES

FAIL = "fail"  # a hook given this instead of a duration fails
# Types after which the VM boots anew; the others pause it (Freeze) or end it for good.
REBOOTS = frozenset({"Reboot", "Redeploy"})
GONE_FOR_GOOD = frozenset({"Preempt", "Terminate"})

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_RANGE = re.compile(r"^(.*)\[(\d+)-(\d+)\](.*)$")
MAX_RANGE = 100_000  # VMs one range may name
MAX_SECONDS = 366 * 86400.0  # a duration longer than a year is a mistake (and would overflow)
# not_before outside these is a mistake, and its instants would not render (year 1, year 9999)
EARLIEST = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
LATEST = dt.datetime(9000, 1, 1, tzinfo=dt.timezone.utc)


@dataclass(frozen=True)
class HookTime:
    """How long one named hook runs in the plan, and whether it fails then (`fail`: at once).
    A hook of the config that FLEET.yaml does not name takes no time. Given a list, each run
    of the hook on the VM takes the next entry (`later`), the last one for every run after:
    `[fail, 2m]` fails once, then succeeds on its retry."""

    seconds: float
    fails: bool = False
    later: tuple[HookTime, ...] = ()

    def nth(self, run: int) -> HookTime:
        """The `run`-th run of the hook on its VM (0: the first)."""
        if run == 0 or not self.later:
            return self
        return self.later[min(run, len(self.later)) - 1]


@dataclass(frozen=True)
class VmSet:
    """One entry of `vms`: its VMs, the config they run, their hooks' durations."""

    where: str  # its key path, `vms[0]`
    names: tuple[str, ...]
    config: Config  # as the daemon would load it (vm_name set per VM by `config_for`)
    hooks: Mapping[str, HookTime]
    cluster_drain: float  # seconds a Pacemaker drain of one of its nodes takes

    def config_for(self, vm: str) -> Config:
        return replace(self.config, vm_name=vm)


@dataclass(frozen=True)
class Maintenance:
    """One entry of `maintenance`: what the cloud announces, to which VMs, when."""

    where: str
    event_type: str
    vms: tuple[str, ...]
    shared: bool  # one event naming every VM, else one event per VM
    notice: Optional[float]  # NotBefore = posted + notice, or:
    not_before: Optional[dt.datetime]
    posted: float  # seconds after the plan's start
    spread: float  # the events are posted at uniformly spaced instants over this
    impact: float  # how long a VM is down once the event starts
    duration: Optional[int] = None  # DurationInSeconds, as IMDS would say it
    cancelled: Optional[float] = None  # withdrawn this long after it is posted, if not started


@dataclass(frozen=True)
class Fleet:
    path: Path
    sets: tuple[VmSet, ...]
    maintenance: tuple[Maintenance, ...]

    def vm_names(self) -> tuple[str, ...]:
        return tuple(name for s in self.sets for name in s.names)

    def set_of(self, vm: str) -> VmSet:
        for s in self.sets:
            if vm in s.names:
                return s
        raise KeyError(vm)


def duration(value: Any) -> Optional[float]:  # noqa: ANN401 - YAML
    """Seconds from `90`, `30s`, `10m`, `2h`, `7d`, `1w` or `1h30m`; None when it is none
    (a negative one included: told apart by `_seconds`)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    if not isinstance(value, str):
        return None
    text = value.strip().lstrip("-").replace(" ", "")
    parts = _DURATION.findall(text)
    if not text or "".join(n + u for n, u in parts) != text:
        return None
    seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    return -seconds if value.strip().startswith("-") else seconds


def expand(spec: str) -> tuple[str, ...]:
    """`web-[1-12]` as web-1 .. web-12 (`web-[01-12]` keeps the zeros); a plain name as is."""
    found = _RANGE.match(spec)
    if found is None:
        return (spec,)
    head, low, high, tail = found.groups()
    width = len(low) if low.startswith("0") and len(low) > 1 else 0
    first, last = int(low), int(high)
    return tuple(f"{head}{n:0{width}d}{tail}" for n in range(first, last + 1))


def load(path: Path, default_config: Path) -> Fleet:
    """Read FLEET.yaml and every config it names; ConfigError lists every problem."""
    from ..config import yaml  # noqa: PLC0415 - PyYAML where a file is read, as config does

    raw = yaml.read(path)
    return parse(raw, path, default_config)


def parse(raw: Any, path: Path, default_config: Path) -> Fleet:  # noqa: ANN401 - YAML
    c = Checker(str(path))
    problems: list[str] = []
    if not isinstance(raw, dict):
        c.fail("", f"must be a mapping with vms and maintenance, got {kind_of(raw)}")
        raise ConfigError(c.problems)
    _known(c, "", raw, ("vms", "maintenance"))
    configs: dict[Path, Optional[Config]] = {}
    sets: list[VmSet] = []
    seen: dict[str, str] = {}
    for i, entry in enumerate(_items(c, "vms", raw.get("vms"))):
        where = f"vms[{i}]"
        found = _vm_set(c, where, entry, path.parent, default_config, configs, problems)
        if found is None:
            continue
        for name in found.names:
            if name in seen:
                c.fail(f"{where}.names", f"{name} is named already by {seen[name]}")
            seen.setdefault(name, where)
        sets.append(found)
    maintenance = tuple(
        m
        for i, entry in enumerate(_items(c, "maintenance", raw.get("maintenance")))
        if (m := _maintenance(c, f"maintenance[{i}]", entry, seen)) is not None
    )
    problems = c.problems + problems
    if problems:
        raise ConfigError(problems)
    return Fleet(path, tuple(sets), maintenance)


def _known(c: Checker, where: str, value: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for key in value:
        if key not in allowed:
            at = f"{where}.{key}" if where else str(key)
            c.fail(at, f"unknown key (expected one of: {', '.join(allowed)})")


def _items(c: Checker, where: str, value: Any) -> list[Mapping[str, Any]]:  # noqa: ANN401
    if not isinstance(value, list):
        c.fail(where, f"must be a list of mappings, got {kind_of(value)}")
        return []
    if not value:
        c.fail(where, "must be a list of mappings, got an empty list")
        return []
    good: list[Mapping[str, Any]] = []
    for i, item in enumerate(value):
        if isinstance(item, dict):
            good.append(item)
        else:
            c.fail(f"{where}[{i}]", f"must be a mapping, got {kind_of(item)}")
    return good


def _names(c: Checker, where: str, value: Any) -> tuple[str, ...]:  # noqa: ANN401
    """A name, a range, or a list of them."""
    specs = value if isinstance(value, list) else [value]
    names: list[str] = []
    for spec in specs:
        if not isinstance(spec, str) or not spec.strip():
            c.fail(where, f"must be a VM name or a range like web-[1-12], got {kind_of(spec)}")
            continue
        size = _range_size(spec.strip())
        if size > MAX_RANGE:
            c.fail(where, f"{spec} names {size} VMs, more than {MAX_RANGE}")
            continue
        found = expand(spec.strip())
        if not found:
            c.fail(where, f"{spec} names no VM")
        names.extend(found)
    if not specs:
        c.fail(where, "must name a VM or a range like web-[1-12], got an empty list")
    return tuple(dict.fromkeys(names))


def _range_size(spec: str) -> int:
    """How many VMs `expand` would name, without naming them."""
    found = _RANGE.match(spec)
    return 1 if found is None else max(0, int(found.group(3)) - int(found.group(2)) + 1)


def _seconds(c: Checker, where: str, value: Any, default: Optional[float]) -> Optional[float]:  # noqa: ANN401
    if value is None:
        return default
    seconds = duration(value)
    if seconds is None:
        c.fail(where, f"must be a duration like 30s, 10m, 2h or 7d, got {value!r}")
    elif seconds < 0:
        c.fail(where, f"must not be negative, got {value!r}")
        return None
    elif seconds > MAX_SECONDS:
        c.fail(where, f"must be at most 366d (a plan covers a year at most), got {value!r}")
        return None
    return seconds


def _vm_set(  # noqa: PLR0917 - one call site
    c: Checker,
    where: str,
    entry: Mapping[str, Any],
    base: Path,
    default_config: Path,
    configs: dict[Path, Optional[Config]],
    problems: list[str],
) -> Optional[VmSet]:
    _known(c, where, entry, ("names", "config", "hooks", "cluster_drain"))
    names = _names(c, f"{where}.names", entry.get("names"))
    written = entry.get("config")
    if written is not None and not isinstance(written, str):
        c.fail(f"{where}.config", f"must be a path, got {kind_of(written)}")
        return None
    config_path = base / written if written else default_config
    if config_path not in configs:
        configs[config_path] = _config(config_path, problems)
    config = configs[config_path]
    drain = _seconds(c, f"{where}.cluster_drain", entry.get("cluster_drain"), 0.0)
    hooks = _hooks(c, f"{where}.hooks", entry.get("hooks"), config, config_path)
    if config is None or not names or drain is None:
        return None
    return VmSet(where, names, config, hooks, drain)


def _config(path: Path, problems: list[str]) -> Optional[Config]:
    """The VM's config as the daemon reads it, less its hook files (they are on the VMs), and
    `provider: auto` as Azure: auto reads the machine's DMI data, and the machine that plans
    is not the VM (a CI runner on AWS would plan Azure's events without approvals)."""
    from ..config import yaml  # noqa: PLC0415

    try:
        raw = yaml.read(path)
        if isinstance(raw, dict) and raw.get("provider", "auto") == "auto":
            raw = {**raw, "provider": "azure"}
        return loader.parse(raw, str(path), path, check_files=False)
    except ConfigError as e:
        problems.extend(e.problems)
        return None


def _hooks(
    c: Checker,
    where: str,
    value: Any,  # noqa: ANN401
    config: Optional[Config],
    config_path: Path,
) -> Mapping[str, HookTime]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        c.fail(where, f"must be a mapping of hook name to duration or fail, got {kind_of(value)}")
        return {}
    hooks: dict[str, HookTime] = {}
    for name, given in value.items():
        at = f"{where}.{name}"
        if config is not None and name not in config.hooks:
            defined = ", ".join(sorted(config.hooks)) or "none"
            c.fail(at, f"unknown hook: {config_path} defines {defined}")
            continue
        if not isinstance(given, list):
            one = _hook_time(c, at, given)
            if one is not None:
                hooks[str(name)] = one
            continue
        if not given:
            c.fail(at, "must be a duration, fail, or a list of them (one per run), got []")
            continue
        runs = [_hook_time(c, f"{at}[{i}]", item) for i, item in enumerate(given)]
        if all(run is not None for run in runs):
            first, *rest = (run for run in runs if run is not None)
            hooks[str(name)] = replace(first, later=tuple(rest))
    return hooks


def _hook_time(c: Checker, at: str, given: Any) -> Optional[HookTime]:  # noqa: ANN401 - YAML
    if given == FAIL:
        return HookTime(0.0, fails=True)
    seconds = _seconds(c, at, given, None)
    return None if seconds is None else HookTime(seconds)


def _maintenance(
    c: Checker, where: str, entry: Mapping[str, Any], fleet: Mapping[str, str]
) -> Optional[Maintenance]:
    keys = ("type", "vms", "shared", "notice", "not_before", "posted", "spread", "impact")
    _known(c, where, entry, (*keys, "duration", "cancelled"))
    event_type = entry.get("type")
    if event_type not in EVENT_TYPES:
        c.fail(f"{where}.type", f"must be one of {', '.join(EVENT_TYPES)}, got {event_type!r}")
    vms = _names(c, f"{where}.vms", entry.get("vms"))
    strangers = [vm for vm in vms if vm not in fleet]
    if strangers and fleet:
        c.fail(f"{where}.vms", f"names no VM of vms: {', '.join(strangers[:5])}")
    shared = entry.get("shared", False)
    if not isinstance(shared, bool):
        c.fail(f"{where}.shared", f"must be true or false, got {kind_of(shared)}")
    notice = _seconds(c, f"{where}.notice", entry.get("notice"), None)
    not_before = _instant(c, f"{where}.not_before", entry.get("not_before"))
    if (entry.get("notice") is None) == (entry.get("not_before") is None):
        c.fail(where, "needs exactly one of notice (a duration) and not_before (ISO 8601)")
    posted = _seconds(c, f"{where}.posted", entry.get("posted"), 0.0)
    spread = _seconds(c, f"{where}.spread", entry.get("spread"), 0.0)
    impact = _seconds(c, f"{where}.impact", entry.get("impact"), 0.0)
    cancelled = _seconds(c, f"{where}.cancelled", entry.get("cancelled"), None)
    length = entry.get("duration")
    if length is not None and (not isinstance(length, int) or isinstance(length, bool)):
        c.fail(f"{where}.duration", f"must be whole seconds (DurationInSeconds), got {length!r}")
        length = None
    if (
        event_type not in EVENT_TYPES
        or not vms
        or strangers
        or posted is None
        or spread is None
        or impact is None
        or (notice is None and not_before is None)
    ):
        return None
    return Maintenance(
        where, str(event_type), vms, shared is True, notice, not_before, posted, spread, impact,
        length, cancelled,
    )  # fmt: skip


def _instant(c: Checker, where: str, value: Any) -> Optional[dt.datetime]:  # noqa: ANN401
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        parsed = value
    else:
        try:
            parsed = parse_instant(str(value))
        except ValueError:
            c.fail(where, f"must be an ISO 8601 instant, got {value!r}")
            return None
    parsed = parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)
    problem = out_of_range(parsed)
    if problem is not None:
        c.fail(where, problem)
        return None
    return parsed


def out_of_range(parsed: dt.datetime) -> Optional[str]:
    """Why an instant (`not_before`, `--from`) cannot be planned, or None: the plan's instants
    run a year or two past it and must still render."""
    if not EARLIEST <= parsed < LATEST:
        return f"must be an instant from 1970 to 8999, got {parsed.isoformat()}"
    return None


def parse_instant(text: str) -> dt.datetime:
    """ISO 8601 (a trailing Z allowed), UTC when it names no zone."""
    text = text.strip()
    parsed = dt.datetime.fromisoformat(text[:-1] + "+00:00" if text[-1:] in "zZ" else text)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)
