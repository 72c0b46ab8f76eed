"""Load the YAML configuration into frozen settings, reporting every problem with its key path.

The daemon runs as root and executes what this file names, so everything is checked here,
once: a config that loads is one the core can trust without further checks. The settings
themselves (config/__init__.py, settings.py) import none of this: the engine takes its types
from there without the walker (urllib.parse) or PyYAML.
"""

from __future__ import annotations

import stat
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional

from . import files, fleet, logic, schema, sections
from .provider import Provider
from .sections import DEFAULT_EVENTS, DEFAULT_HOOKS
from .settings import (
    ApprovePolicy,
    Config,
    ConfigError,
    EventRule,
    Hook,
    Pacemaker,
    UserEvents,
    frozen,
)
from .walker import MAX_PROBLEM, Checker

__all__ = [
    "DEFAULT_EVENTS",
    "DEFAULT_HOOKS",
    "DEFAULT_PATH",
    "MAX_PROBLEM",
    "key_paths",
    "load",
    "parse",
    "parse_yaml",
]

DEFAULT_PATH = Path("/etc/scheduledeventsd/config.yaml")


def key_paths() -> frozenset[str]:
    """Every key path a config may hold; user-chosen names (hook names) are `*`."""
    return schema.key_paths()


def parse(
    raw: Any,  # noqa: ANN401 - YAML
    source: str,
    path: Optional[Path] = None,
    *,
    check_files: bool = True,
) -> Config:
    """Validate an already-loaded YAML value; raise ConfigError listing every problem.

    `check_files=False` skips looking at the hook files on this machine (to compare the
    documented defaults on a machine without /etc/scheduledeventsd); the daemon never does.
    """
    c = Checker(source, check_files=check_files)
    if raw is not None and not isinstance(raw, dict):
        c.section(raw, "", "")
        raise ConfigError(c.problems)
    given, old_cluster, warnings = logic.old_cluster_spelling(c, raw or {})
    top = c.section(given, "", "")
    cloud, why = sections.provider(top)
    vm_name = top.get("vm_name", schema.text("vm_name"))
    if any(ch.isspace() for ch in vm_name):
        c.fail("vm_name", f"must not contain white space, got {vm_name!r}")
    approve = ApprovePolicy(top.get("approve", schema.text("approve")))
    hooks = _hooks(c, given, top)
    events = _events(c, given, top, hooks)
    coordination = fleet.coordination(c, top.get("coordination"))
    cluster = _cluster(c, top, old_cluster)
    logic.slots_need_etcd(c, "concurrency" in top, coordination)
    logic.all_needs_peers(c, approve, events, coordination is not None or cluster is not None)
    config = Config(
        path=path,
        metadata=sections.metadata(c, top.get("metadata", {}), cloud),
        vm_name=None if vm_name == "auto" else vm_name,
        state_dir=files.check_state_dir(c, top.get("state_dir", schema.text("state_dir"))),
        approve=approve,
        user_events=UserEvents(top.get("user_events", schema.text("user_events"))),
        hooks=hooks,
        events=events,
        environment=sections.environment(c, top.get("environment", {})),
        shutdown_grace=top.get("shutdown_grace", schema.number("shutdown_grace")),
        coordination=coordination,
        cluster=cluster,
        listen=sections.listen(top.get("http", {})),
        metrics_textfile=files.check_textfile(c, top.get("metrics_textfile")),
        unhealthy_from=sections.health(top.get("health", {})),
        webhooks=sections.webhooks(c, top.get("webhooks", [])),
        windows=sections.windows(c, top.get("windows", [])),
        concurrency=fleet.concurrency(c, top.get("concurrency")),
        provider=cloud,
        provider_why=why,
        warnings=(*warnings, *_provider_warnings(cloud, given, events)),
    )
    if c.problems:
        raise ConfigError(c.problems)
    return replace(config, warnings=config.warnings + fleet.hold_warnings(config))


def _hooks(c: Checker, given: Mapping[str, Any], top: Mapping[str, Any]) -> Mapping[str, Hook]:
    if given.get("hooks") is None:
        # The defaults are checked like written ones: a missing default hook is found now,
        # not when the first event arrives.
        return frozen(sections.hooks(c, schema.key("hooks").default, "hooks (default)"))
    return frozen(sections.hooks(c, top.get("hooks", {})))


def _events(
    c: Checker, given: Mapping[str, Any], top: Mapping[str, Any], hooks: Mapping[str, Hook]
) -> Mapping[str, EventRule]:
    if given.get("events") is None:
        logic.default_events_defined(c, sections.DEFAULT_NAMED, hooks)
        return DEFAULT_EVENTS
    return frozen(sections.events(c, top.get("events", {}), hooks))


def _cluster(c: Checker, top: Mapping[str, Any], old: Any) -> Optional[Pacemaker]:  # noqa: ANN401
    """cluster.pacemaker, or the same settings from its old spelling, checked where written."""
    if old is not None:
        fields = c.section(old, logic.OLD_CLUSTER, "cluster.pacemaker")
        return fleet.pacemaker(c, fields, logic.OLD_CLUSTER)
    section = top.get("cluster", {}).get("pacemaker")
    return None if section is None else fleet.pacemaker(c, section, "cluster.pacemaker")


def _provider_warnings(
    provider: Provider, top: Mapping[str, Any], events: Mapping[str, EventRule]
) -> tuple[str, ...]:
    """Keys that mean nothing for this provider: said, not refused, so one config serves every
    cloud."""
    if provider.can_approve:
        return ()
    found = []
    asking = [
        where
        for where, value in [
            ("approve", top.get("approve")),
            *((f"events.{t}.approve", r.approve and r.approve.value) for t, r in events.items()),
        ]
        if value not in (None, "never")
    ]
    if asking:
        found.append(
            f"{asking[0]}: {provider.value} takes no approval through its metadata service: "
            "nothing is posted, events proceed at their own time (hooks, after-hooks and "
            "everything else work)"
        )
    if isinstance(top.get("metadata"), dict) and "api_version" in top["metadata"]:
        found.append(f"metadata.api_version: Azure's alone; {provider.value} ignores it")
    return tuple(found)


def parse_yaml(text: str) -> Any:  # noqa: ANN401 - YAML
    """YAML as the config is read: safe, no duplicate keys, no aliases, YAML 1.2 (yaml.py).
    PyYAML is imported where a file is read, not with the rest of the checks."""
    from . import yaml  # noqa: PLC0415

    return yaml.parse_yaml(text)


def load(path: Path, *, reader: Optional[Callable[[Path], str]] = None) -> Config:
    """Read and validate a config file; a missing file is an error, never silent defaults,
    and so is one that anyone but root could have changed (the rule of hook files)."""
    from . import yaml  # noqa: PLC0415 - see parse_yaml

    # It says what runs as root: trusted as a hook is, and the checked real file is read (a
    # symbolic link others can retarget is followed once, before the check).
    real, distrust = files.untrusted(str(path), what=files.CONFIG)
    raw = yaml.read(path, reader or (lambda _: yaml.read_bounded(Path(real))))
    try:
        config = parse(raw, str(path), path)
    except ConfigError as e:
        raise ConfigError([distrust, *e.problems] if distrust else e.problems) from None
    if distrust:
        raise ConfigError([distrust])
    return replace(config, warnings=config.warnings + _secret_warnings(config, path))


def _secret_warnings(config: Config, path: Path) -> tuple[str, ...]:
    """Webhook URLs (a Slack or Teams URL is its own secret) and headers in a file others can
    read: worth a warning, not a refusal (the shipped file is 0644 and holds none)."""
    secrets = [
        f"webhooks[{i}].{'headers' if hook.headers else 'url'}"
        for i, hook in enumerate(config.webhooks)
    ]
    try:
        mode = path.stat().st_mode
    except OSError:
        return ()
    if not secrets or not mode & (stat.S_IRGRP | stat.S_IROTH):
        return ()
    return (
        f"{path}: {secrets[0]}: a secret in a file readable by group or others "
        f"(mode {stat.S_IMODE(mode):o}); chmod 600 {path}",
    )
