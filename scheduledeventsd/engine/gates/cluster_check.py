"""The drain gate's check of its Pacemaker cluster (cluster.pacemaker): read at start and every
CLUSTER_CHECK, kept for `status` (which exits 1 while there are problems), logged on change."""

from __future__ import annotations

import math

from ...records import Level, Record, What
from ..frozen import replace
from ..state import State
from ..vocabulary.constants import CLUSTER_CHECK
from ..vocabulary.effects import CheckCluster, Effect
from ..vocabulary.messages import ClusterChecked


def _cluster_checked(state: State, msg: ClusterChecked, now: float, out: list[Effect]) -> State:
    """Kept for `status` (which exits 1 while there are problems) and read again every
    CLUSTER_CHECK; logged when it changes."""
    if state.config.cluster is None:  # answered after a reload took the section away
        return state
    changed = msg.problems != state.cluster_problems
    state = replace(state, cluster_problems=msg.problems, cluster_check_at=now + CLUSTER_CHECK)
    if not changed:
        return state
    if msg.problems:
        out.append(
            Record(
                Level.ERROR,
                What.CLUSTER_UNREADY,
                {
                    "problems": list(msg.problems),
                    "reason": "until this is fixed, events that drain this node are held (no "
                    "early approval)",
                },
            )
        )
    else:
        out.append(Record(Level.INFO, What.CLUSTER_READY, {}))
    return state


def _recheck_cluster(state: State, now: float, out: list[Effect]) -> State:
    if state.cluster_check_at <= now and state.config.cluster is not None:
        out.append(CheckCluster())
        state = replace(state, cluster_check_at=math.inf)  # until ClusterChecked comes back
    return state
