"""Which marks count for a shared event (coordination/peers.py `round_states`): a `ready` from a
round already decided does not, for a VM that writes in the round after it. The rule reads
etcd's revisions (the settled key's mod_revision against each mark's), pure below, then against
a real etcd, through a compaction."""

from __future__ import annotations

import subprocess
import uuid

import pytest

from scheduledeventsd.config import Etcd
from scheduledeventsd.coordination.etcd import EtcdClient, KeyValue
from scheduledeventsd.coordination.peers import event_prefix, round_states, settled_key

pytestmark = pytest.mark.xdist_group(name="etcd")

PREFIX = "/p/events/E/"
SETTLED = "/p/settled/E"
READY = b'{"state": "ready"}'
FAILED = b'{"state": "failed"}'


def mark(vm: str, revision: int, value: bytes = READY) -> KeyValue:
    return KeyValue(PREFIX + vm, value, "1", revision)


def settled(revision: int) -> KeyValue:
    return KeyValue(SETTLED, READY, "1", revision)


def states(own: str, *kvs: KeyValue) -> dict[str, str]:
    return round_states(list(kvs), PREFIX, PREFIX + own, SETTLED)


def test_a_ready_older_than_settled_does_not_count_for_a_vm_whose_mark_is_newer():
    """vm-c's ready (5) settled the first round (6) and stayed (its daemon down); vm-a writes
    in the round back (9): vm-c is not ready in it, vm-a and vm-b are."""
    got = states("vm-a", mark("vm-a", 9), mark("vm-b", 8), mark("vm-c", 5), settled(6))
    assert got == {"vm-a": "ready", "vm-b": "ready"}


def test_a_failed_older_than_settled_still_counts():
    """A `failed` from before blocks the approval (the safe way): vm-c must write again."""
    got = states("vm-a", mark("vm-a", 9), mark("vm-c", 5, FAILED), settled(6))
    assert got == {"vm-a": "ready", "vm-c": "failed"}


def test_a_vm_reading_the_round_being_decided_counts_every_ready():
    """Woken by the settled key of its own round, vm-a (its mark at 3, older than settled)
    finds every VM ready, the completer's ready included."""
    got = states("vm-a", mark("vm-a", 3), mark("vm-b", 4), mark("vm-c", 5), settled(6))
    assert got == dict.fromkeys(("vm-a", "vm-b", "vm-c"), "ready")


def test_without_a_settled_key_every_mark_counts():
    got = states("vm-a", mark("vm-a", 9), mark("vm-c", 5))
    assert got == {"vm-a": "ready", "vm-c": "ready"}


def test_the_settled_key_rewritten_by_a_later_round_is_the_floor_not_its_first_write():
    """Settled created at 6 (round 1), rewritten at 20 by the VM that completed round 2, and
    never deleted (vm-c down again before it forgot): vm-c's ready of round 2 (19) is newer
    than settled's creation but older than its last write, and does not count in round 3."""
    got = states("vm-a", mark("vm-a", 30), mark("vm-c", 19), settled(20))
    assert got == {"vm-a": "ready"}


def test_revisions_from_a_real_etcd_keep_the_rule_through_a_compaction(cluster):
    """vm-c's ready and the settled key of round 1, then a compaction at the head: vm-a's
    write of round 2, in one transaction with its read of the marks and settled, does not
    count vm-c's (etcd keeps a live key's revisions through a compaction)."""
    settings = Etcd(endpoints=tuple(cluster.endpoints), prefix=f"/sed-{uuid.uuid4().hex[:8]}")
    prefix, done = event_prefix(settings, "E"), settled_key(settings, "E")
    client = EtcdClient(settings)
    try:
        client.put(prefix + "vm-c", READY)
        head = client.put(done, READY)
        etcdctl = ["etcdctl", "--endpoints", ",".join(cluster.endpoints), "compact", str(head)]
        subprocess.run(etcdctl, capture_output=True, timeout=20, check=True)
        lease = client.grant(30)
        revision, kvs = client.put_and_range(prefix + "vm-a", READY, lease, prefix, done)
        assert revision > head
        assert round_states(kvs, prefix, prefix + "vm-a", done) == {"vm-a": "ready"}
        _, kvs = client.range_with(prefix, done)
        assert round_states(kvs, prefix, prefix + "vm-c", done) == {
            "vm-a": "ready",
            "vm-c": "ready",
        }, "vm-c's own view of its round"
        client.revoke(lease)  # vm-a's mark
        client.delete(prefix + "vm-c", READY)
        client.delete(done, READY)
    finally:
        client.close()
