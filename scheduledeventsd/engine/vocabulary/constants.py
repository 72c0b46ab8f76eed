"""The engine's timings and limits, and what a hook run's end means to it.

KILL_GRACE, GATE_LATER and Outcome moved here from hooks.py, which imports them from here: the
engine speaks of a run's end and of the gate's "not yet" without importing the module that starts
processes.
"""

from __future__ import annotations

import enum

from ...retry import Backoff

KILL_GRACE = 5.0  # seconds between SIGTERM and SIGKILL to a timed-out hook's group
GATE_LATER = 75  # EX_TEMPFAIL: the gate's "not yet, ask again"


class Outcome(str, enum.Enum):
    """How a run of commands ended: the one classification hooks, gates and the engine share."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"  # a command failed, timed out, or could not start
    CANCELLED = "cancelled"  # we stopped it (shutdown, or its event left): it did not finish


POLL_BACKOFF_CAP = 2.0  # a Preempt may give well under 30 s: never be blind for longer
APPROVAL_BACKOFF = Backoff(0.5, 8.0)
# At boot IMDS is often unreachable for a few seconds: ask for the name again soon, then rarely.
NAME_BACKOFF = Backoff(2.0, 60.0)
# etcd without quorum or a gate timing out: ask again soon, never more than every 10 s, so a
# cluster back before NotBefore is used at once.
COORDINATION_BACKOFF = Backoff(0.5, 10.0)
# After cancelling hooks at shutdown: the runner's SIGKILL comes KILL_GRACE after SIGTERM; the
# margin lets their results arrive before the daemon exits.
KILL_WAIT = KILL_GRACE + 2.0
STOP_MARGIN = 10.0  # beyond the grace and the kill wait, for the final state write
# A fetch in flight this much longer than its own timeouts means its worker is wedged: the
# watchdog is no longer pinged, so systemd restarts the daemon.
STALL_MARGIN = 30.0
# The wall clock moved against the monotonic one by more than this since NotBefore times were
# placed: place them again (an NTP step, a VM resumed from a pause).
CLOCK_STEP = 1.0
# IMDS answers 429 past 5 requests a second per VM, approvals included. Polls, approvals and
# name lookups share that budget: at 4 Hz an approval waits at most for the oldest poll of the
# second to leave the window (< 0.25 s), and the poll after it for the approval, rather than
# either being refused with a 429 (every approval cost one at 4 Hz before).
IMDS_RATE = 5
RATE_WINDOW = 1.02  # the margin covers up to 20 ms of jitter in the latency to IMDS
TAKE_BACK = 0.02  # a poll ordered for sooner than this may be under way: it is not taken back
# A shared event under pacemaker: how often the cluster is read for the other nodes' drains.
CLUSTER_ASK = 2.0
# Pacemaker: how often the cluster's readiness to drain this node is read again, for `status`.
CLUSTER_CHECK = 60.0
# Pacemaker: a restore not answered by then counts as failed (asked again; the after-hooks that
# waited for it start). The drainer's restore makes at most three tool calls of at most 30 s
# each (pacemaker.TOOL_TIMEOUT), after a mark being set that it may wait for: 2 min at worst.
RESTORE_TIMEOUT = 180.0
# An approval is sent only while its slot's lease is confirmed for this long more, so the POST
# reaches IMDS before the lease can expire and the slot go to another VM. Renewed every third
# of its ttl (5 s at least), a healthy lease always has more than 3 s left.
SLOT_MARGIN = 1.0
# A slot asked for when the hooks are due (at start_before's lead, a window's lead) gets this
# long for etcd's answer before they start without it: a healthy cluster answers within
# milliseconds, a leader election within a second or two. An answer that every slot is taken
# (or that etcd cannot be asked) ends the wait at once.
SLOT_GRACE = 5.0
