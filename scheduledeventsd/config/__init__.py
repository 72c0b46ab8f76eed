"""The configuration: the frozen settings the daemon and the engine use, and their loader.

This face holds the settings alone, so that importing them (the engine does) reaches no I/O:
the loader, its walker (urllib.parse) and PyYAML are imported from `config.loader` by those
that read a file (the CLI, the daemon's reload).

    schema.py    every key, declared once (kind, default, range, choices, required, doc)
    settings.py  the frozen settings (one class per section; enums from the choices)
    loader.py    a YAML file or value -> a checked Config, every problem named by its path:
    walker.py      checks any value by its key's declaration
    sections.py, fleet.py   the settings of each section, from checked values
    logic.py       the rules between keys; yaml.py the YAML reader; files.py the disk
"""

from __future__ import annotations

from .settings import (
    NOT_BACK,
    STAGES,
    WINDOWED,
    ApprovePolicy,
    Concurrency,
    Config,
    ConfigError,
    Coordination,
    DrainMethod,
    Etcd,
    EventRule,
    Gate,
    HealthFrom,
    Hook,
    HookCommand,
    Limit,
    Listen,
    Metadata,
    Pacemaker,
    ProviderSetting,
    UserEvents,
    Webhook,
    WebhookFormat,
)

__all__ = [
    "NOT_BACK",
    "STAGES",
    "WINDOWED",
    "ApprovePolicy",
    "Concurrency",
    "Config",
    "ConfigError",
    "Coordination",
    "DrainMethod",
    "Etcd",
    "EventRule",
    "Gate",
    "HealthFrom",
    "Hook",
    "HookCommand",
    "Limit",
    "Listen",
    "Metadata",
    "Pacemaker",
    "ProviderSetting",
    "UserEvents",
    "Webhook",
    "WebhookFormat",
]
