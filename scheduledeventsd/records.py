"""What the engine says happened, as typed records: the log lines, webhooks and metrics are
derived from them, and nothing (the engine least of all) decides anything by a record's name.

A record *describes*; the journal's name for it is `What`'s value, so renaming a log line is a
change here and in the README's list, never a behaviour change elsewhere.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field


class Level(str, enum.Enum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class What(str, enum.Enum):
    """Every record the engine can emit; the value is its name in the journal."""

    DAEMON_STARTING = "daemon_starting"
    DAEMON_STOPPING = "daemon_stopping"
    DAEMON_STOPPED = "daemon_stopped"
    STATE_DEGRADED = "state_degraded"
    STATE_RECOVERED = "state_recovered"
    STATE_REPAIRED = "state_repaired"
    VM_NAME = "vm_name"
    VM_NAME_FALLBACK = "vm_name_fallback"
    DOCUMENT_CHANGED = "document_changed"
    CLOCK_MOVED = "clock_moved"
    EVENT_SKIPPED = "event_skipped"
    POLL_FAILED = "poll_failed"
    POLL_RECOVERED = "poll_recovered"
    POLL_STALLED = "poll_stalled"
    IMDS_REJECTED_REQUEST = "imds_rejected_request"
    EVENT_IGNORED = "event_ignored"
    EVENT_DETECTED = "event_detected"
    EVENT_MISSED = "event_missed"
    EVENT_UNHANDLED = "event_unhandled"
    EVENT_WAITING = "event_waiting"
    EVENT_RULE = "event_rule"
    EVENT_STATUS_CHANGED = "event_status_changed"
    EVENT_TYPE_CHANGED = "event_type_changed"
    EVENT_GONE = "event_gone"
    EVENT_GONE_WHILE_HOOKS_RUNNING = "event_gone_while_hooks_running"
    EVENT_COMPLETED = "event_completed"
    EVENT_CANCELLED = "event_cancelled"
    EVENT_UNMARKED = "event_unmarked"
    REBOOT_DETECTED = "reboot_detected"
    HOOKS_INTERRUPTED = "hooks_interrupted"
    HOOKS_CANCELLED = "hooks_cancelled"
    HOOK_RESULT_IGNORED = "hook_result_ignored"
    AFTER_HOOKS_FINISHED = "after_hooks_finished"
    AFTER_HOOKS_FAILED = "after_hooks_failed"
    AFTER_HOOKS_INTERRUPTED = "after_hooks_interrupted"
    APPROVAL_NOT_NEEDED = "approval_not_needed"
    APPROVAL_SKIPPED = "approval_skipped"
    APPROVAL_FAILED = "approval_failed"
    EVENT_APPROVED = "event_approved"
    EVENT_NOT_APPROVED = "event_not_approved"
    EVENT_COORDINATING = "event_coordinating"
    PEERS_WAITING = "peers_waiting"
    PEERS_READY = "peers_ready"
    GATE_APPROVED = "gate_approved"
    GATE_NOT_YET = "gate_not_yet"
    COORDINATION_FAILED = "coordination_failed"
    SLOT_ACQUIRED = "slot_acquired"
    SLOT_UNAVAILABLE = "slot_unavailable"
    SLOT_RELEASED = "slot_released"
    SLOT_HELD = "slot_held"
    SLOT_HELD_THROUGH = "slot_held_through"
    SLOT_LOST = "slot_lost"
    SLOT_FAILED = "slot_failed"
    SLOT_FREED_BY_OPERATOR = "slot_freed_by_operator"
    COORDINATION_RECOVERED = "coordination_recovered"
    CLUSTER_READY = "cluster_ready"
    CLUSTER_UNREADY = "cluster_unready"
    CLUSTER_DRAINING = "cluster_draining"
    CLUSTER_DRAINED = "cluster_drained"
    CLUSTER_HOLD = "cluster_hold"
    CLUSTER_RESTORED = "cluster_restored"
    CLUSTER_RESTORE_FAILED = "cluster_restore_failed"
    CONFIG_RELOADED = "config_reloaded"
    CONFIG_INVALID = "config_invalid"
    CONFIG_RELOAD_FAILED = "config_reload_failed"
    RELOAD_IGNORED = "reload_ignored"
    TRANSITION_REFUSED = "transition_refused"


class Cause(str, enum.Enum):
    """Why an event of ours is not approved (the `cause` field of event_not_approved)."""

    HOOKS_FAILED = "hooks_failed"
    PEER_FAILED = "peer_failed"
    GATE_REFUSED = "gate_refused"
    SLOT_UNAVAILABLE = "slot_unavailable"  # prepared without a concurrency slot
    CLUSTER_HOLD = "cluster_hold"  # the Pacemaker cluster could not spare this node


@dataclass(frozen=True)
class Record:
    """One thing that happened, with the fields the journal, webhooks and metrics show."""

    level: Level
    what: What
    fields: Mapping[str, object] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.what.value
