"""Slots (etcd) and a Pacemaker drain together (issue 28, "With a cluster"), on the real
3-node cluster in namespaces (tests/pacemaker_cluster) plus a real 3-member etcd running in the
cluster's hub network, where every node reaches it: one daemon per node, inside it, each with
`concurrency: {max: 1}` and `cluster.pacemaker`, each given a Reboot by its own simulator.

What is asserted is read at the instant it happens, by the processes that make it happen:
`crm_attribute` is wrapped inside each node (bind-mounted over the tool in the node's mount
namespace) so every mark and restore the daemon makes records, just before and just after the
real tool, which VM holds the slot in etcd (etcdctl); the hooks record, as they start, their
node's mark and the slot's holder; an `etcdctl watch` records each change of the slot key.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import shutil
import subprocess
import threading
import time
import uuid
from base64 import b64decode
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pytest

from scheduledeventsd.simulators.azure import Simulator
from scheduledeventsd.simulators.scenario import Scenario
from tests.conftest import DaemonFactory, Hooks, wait_for
from tests.etcd_cluster import Cluster as Etcd
from tests.pacemaker_cluster import HUB_ADDRESS, RED, Cluster, Node, in_netns
from tests.system.test_pacemaker import (  # noqa: F401 - the module's cluster fixtures
    ATTRIBUTE,
    Nodes,
    cluster,
    healthy,
)

pytestmark = [pytest.mark.pacemaker, pytest.mark.xdist_group("pacemaker")]
GROUP = "nodes"
NAMES = ("node1", "node2", "node3")
# A restore takes this long (s) here, as on a busy cluster: a slot given back before the restore
# is done lets the next node be marked while this one still is.
RESTORE_TAKES = 1


@pytest.fixture(scope="module")
def etcd(pacemaker: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Etcd]:
    """Three etcd members in the cluster's hub network: the nodes reach it over their veth
    (the machine's own loopback is not in their network namespace)."""
    with Etcd(tmp_path_factory.mktemp("etcd"), host=HUB_ADDRESS, netns=pacemaker.hub) as members:
        yield members


class SlotNodes(Nodes):
    """Nodes (test_pacemaker) whose daemons each poll a simulator of their own."""

    def __init__(self, tmp_path: Path, pcmk: Cluster, hooks: Hooks) -> None:
        self.sims: dict[str, Simulator] = {}
        for name in NAMES:
            sim = Simulator(
                Scenario(vm_name=name, start_after_approval=0.5, started_for=1.0),
                rate_limit=False,
            )
            in_netns(pcmk.hub, lambda s=sim: s.start(HUB_ADDRESS, 0))
            self.sims[name] = sim
        super().__init__(tmp_path, self.sims[NAMES[0]], pcmk, hooks)

    def factory(self, node: Node) -> DaemonFactory:
        if node.name not in self.factories:
            (self.tmp_path / node.name).mkdir(exist_ok=True)
            self.factories[node.name] = DaemonFactory(
                self.tmp_path / node.name, self.sims[node.name]
            )
        return self.factories[node.name]

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            for sim in self.sims.values():
                sim.stop()


@pytest.fixture
def nodes(
    tmp_path: Path,
    healthy: Cluster,  # noqa: F811 - the fixture
    hooks: Hooks,
) -> Iterator[SlotNodes]:
    n = SlotNodes(tmp_path, healthy, hooks)
    yield n
    n.stop()


def etcdctl_get(etcd: Etcd, prefix: str) -> str:
    """The shell words reading every key under `prefix`, as one line of JSON."""
    return f"etcdctl --endpoints {','.join(etcd.endpoints)} -w json get --prefix {prefix}"


def holders(reading: str) -> list[str]:
    """The VMs holding a slot in an `etcdctl -w json get` reading."""
    kvs = json.loads(reading).get("kvs", [])
    return [json.loads(b64decode(kv["value"]))["vm"] for kv in kvs]


@dataclass(frozen=True)
class Mark:
    """One `crm_attribute --update` of this daemon's attribute, as the wrapper saw it."""

    node: str
    value: str
    start: float
    end: float
    status: int
    held_before: list[str]  # the slot's holders just before the real tool ran
    held_after: list[str]  # and just after it returned


@contextlib.contextmanager
def recorded_marks(
    pcmk: Cluster, etcd: Etcd, prefix: str, tmp_path: Path, refuse: Optional[Path] = None
) -> Iterator[Path]:
    """Inside every node, `crm_attribute --update` of the health attribute records the slot's
    holders just before and just after the real tool (one line each call), a restore taking
    RESTORE_TAKES longer, and refused (exit 102, the tool not run) while `refuse` exists;
    everything else goes to the real tool untouched."""
    refuse = refuse or tmp_path / "never"
    real = tmp_path / "crm_attribute.real"
    shutil.copy("/usr/sbin/crm_attribute", real)
    log = tmp_path / "marks.log"
    wrapper = tmp_path / "crm_attribute"
    read = etcdctl_get(etcd, f"{prefix}/slots/")
    wrapper.write_text(
        "#!/bin/sh\n"
        f'case " $* " in *" --name {ATTRIBUTE} "*"--update "*) ;; '
        f'*) exec {real} "$@" ;; esac\n'
        "start=$(date +%s.%N)\n"
        f"before=$({read})\n"
        f'case " $* " in *" --update 0 "*) sleep {RESTORE_TAKES}; [ -e {refuse} ] && refused=1 ;; '
        "esac\n"
        'if [ -n "$refused" ]; then echo "injected: update refused" >&2; status=102; '
        f'else {real} "$@"; status=$?; fi\n'
        f"after=$({read})\n"
        "end=$(date +%s.%N)\n"
        f"printf '%s\\t%s\\t%s\\t%s\\t%s\\t%s\\n' \"$*\" $start $end $status "
        f'"$before" "$after" >> {log}\n'
        "exit $status\n"
    )
    wrapper.chmod(0o755)
    mounted = []
    try:
        for node in pcmk.nodes:
            node.run("mount", "--bind", str(wrapper), "/usr/sbin/crm_attribute")
            mounted.append(node)
        yield log
    finally:
        for node in mounted:
            # lazily: a wrapper still exiting keeps the file busy, and a mount left behind
            # would serve the next test's calls
            node.run("umount", "--lazy", "/usr/sbin/crm_attribute", check=False)


def read_marks(log: Path) -> list[Mark]:
    marks = []
    for line in log.read_text().splitlines() if log.exists() else []:
        args, start, end, status, before, after = line.split("\t")
        words = args.split()
        marks.append(
            Mark(
                words[words.index("--node") + 1],
                words[words.index("--update") + 1],
                float(start),
                float(end),
                int(status),
                holders(before),
                holders(after),
            )
        )
    return marks


class SlotWatch:
    """`etcdctl watch` on the slot keys, each change stamped as it arrives: (time, PUT vm or
    DELETE)."""

    def __init__(self, etcd: Etcd, prefix: str) -> None:
        argv = ["etcdctl", "--endpoints", ",".join(etcd.endpoints), "watch", "--prefix",
                f"{prefix}/slots/", "-w", "json"]  # fmt: skip
        self.proc = subprocess.Popen(
            etcd.argv(*argv), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self.changes: list[tuple[float, str, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            at = time.time()
            with contextlib.suppress(ValueError):
                for change in json.loads(line).get("Events", []):
                    kv = change["kv"]
                    if change.get("type") == 1:  # DELETE
                        self.changes.append((at, "DELETE", ""))
                    else:
                        self.changes.append((at, "PUT", json.loads(b64decode(kv["value"]))["vm"]))

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self._reader.join(5)


def stamp(record: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00")).timestamp()


def hook_lines(hooks: Hooks, name: str) -> list[tuple[float, str, list[str]]]:
    """(when it started, its node's mark then, the slot's holders then)."""
    path = hooks.out / name
    lines = path.read_text().splitlines() if path.exists() else []
    return [
        (float(at), mark, holders(reading))
        for at, mark, reading in (line.split("\t") for line in lines)
    ]


def start_daemons(
    nodes: SlotNodes,
    etcd: Etcd,
    prefix: str,
    hooks: Hooks,
    names: tuple[str, ...],
    after_hooks: bool = True,
) -> dict[str, Any]:
    """A daemon in each node: `max: 1` over etcd, cluster.pacemaker; its before- and
    after-hooks (unless not `after_hooks`) record as they start when, its node's mark and the
    slot's holders."""
    read = etcdctl_get(etcd, f"{prefix}/slots/")
    daemons = {}
    for name in names:
        node = nodes.cluster.node(name)
        record = (
            "at=$(date +%s.%N)\n"
            f"mark=$(/usr/sbin/crm_attribute --node {name} --name '{ATTRIBUTE}' --query "
            "--quiet --lifetime forever 2>/dev/null)\n"
            f"slots=$({read})\n"
        )
        line = 'printf \'%s\\t%s\\t%s\\n\' $at "$mark" "$slots"'
        before = hooks.make(f"{name}-before", f'{record}{line} >> "$OUT/{name}.before"')
        after = hooks.make(
            f"{name}-after",
            f'{record}{line} >> "$OUT/{name}.after"\ndate +%s.%N >> "$OUT/{name}.after-end"',
        )
        cfg = nodes.factory(node).config(
            vm_name=name,
            approve="always",
            coordination={"etcd": {"endpoints": etcd.endpoints, "prefix": prefix, "timeout": 2}},
            concurrency={"group": GROUP, "max": 1, "ttl": 10},
            cluster={"pacemaker": {"drain_timeout": 30}},
            hooks={"before": [{"command": [before]}], "after": [{"command": [after]}]},
            events={"Reboot": {"before": ["before"], "after": ["after"] if after_hooks else []}},
        )
        daemons[name] = nodes.start(node, cfg)
    return daemons


def test_each_node_takes_the_slot_before_its_drain_and_is_restored_before_it_gives_it_back(
    nodes,
    healthy,  # noqa: F811 - the fixture
    etcd,
    hooks,
    tmp_path,
):
    """max 1 over three nodes, a Reboot each at once: every mark of a node is made while its
    own VM alone holds the slot; its before-hooks start after the drain, marked; its
    after-hooks start restored and still holding the slot; every restore is done with the slot
    still held; the next node is marked only after that, so no two nodes are ever marked at
    once by the daemons."""
    pcmk = healthy
    prefix = f"/sed-{uuid.uuid4().hex[:8]}"
    watch = SlotWatch(etcd, prefix)
    with recorded_marks(pcmk, etcd, prefix, tmp_path) as log:
        daemons = start_daemons(nodes, etcd, prefix, hooks, NAMES)
        events = {
            name: nodes.sims[name].add_event("Reboot", [name], not_before_in=3600) for name in NAMES
        }
        for name in NAMES:
            daemons[name].wait_log("slot_released", timeout=90, event_id=events[name])
        marks = read_marks(log)
    watch.stop()

    # Each node: marked once (away) and restored once, by its own daemon, in that order.
    by_node = {name: [m for m in marks if m.node == name] for name in NAMES}
    for name, (mark, restore) in ((n, by_node[n]) for n in NAMES):
        assert (mark.value, restore.value) == (str(RED), "0"), by_node[name]
        assert mark.status == restore.status == 0, by_node[name]
        assert mark.held_before == [name], f"{name} marked without holding the slot: {mark}"
        assert restore.held_after == [name], f"{name}'s slot gone before its restore: {restore}"
        daemon = daemons[name]
        acquired = stamp(daemon.logs("slot_acquired", event_id=events[name])[0])
        draining = stamp(daemon.logs("cluster_draining", event_id=events[name])[0])
        drained = stamp(daemon.logs("cluster_drained", event_id=events[name])[0])
        restored = stamp(daemon.logs("cluster_restored", event_id=events[name])[0])
        released = stamp(daemon.logs("slot_released", event_id=events[name])[0])
        assert acquired <= draining <= mark.start < drained, name
        ((before_at, before_mark, before_held),) = hook_lines(hooks, f"{name}.before")
        assert drained <= before_at, "the before-hooks after the drain"
        assert before_mark == str(RED)
        assert before_held == [name]
        ((after_at, after_mark, after_held),) = hook_lines(hooks, f"{name}.after")
        assert restore.end <= after_at, "restored before the after-hooks"
        assert after_mark == "0"
        assert after_held == [name], "the slot held through the after-hooks"
        after_end = float((hooks.out / f"{name}.after-end").read_text())
        assert restore.end <= restored <= after_at <= after_end <= released, name

    # One node at a time: each marked from its mark's start to its restore's end (wider than
    # what the cluster saw); the next node's mark starts after the previous one's restore.
    spans = sorted((by_node[n][0].start, by_node[n][1].end, n) for n in NAMES)
    for (_, restored_at, earlier), (marked_at, _, later) in zip(spans, spans[1:]):
        assert restored_at < marked_at, f"{later} marked while {earlier} was: {spans}"
    # etcd's own record: the slot went from VM to VM, given back between them, in that order.
    changes = [(what, vm) for _, what, vm in watch.changes]
    order = [n for _, _, n in spans]
    expected = [c for n in order for c in (("PUT", n), ("DELETE", ""))]
    deduplicated = [c for i, c in enumerate(changes) if i == 0 or c != changes[i - 1]]
    assert deduplicated == expected, changes


def test_a_restore_that_fails_keeps_the_slot_so_the_next_node_is_marked_only_once_it_works(
    nodes,
    healthy,  # noqa: F811 - the fixture
    etcd,
    hooks,
    tmp_path,
):
    """Restore, then release (issue 28), when the restore fails: node1's `crm_attribute
    --update 0` exits 102 (refused, not applied) for a while, the drainer tries it again with
    backoff until it works. node1's slot must stay held until then, so node2, waiting for the
    slot, is marked only after node1 is back: never two nodes marked at once under `max: 1`.
    Was: node1's after-hooks ran on the failed answer, their success gave the slot back, and
    node2 was marked 0.15 s later, for the ~10 s node1 stayed marked."""
    pcmk = healthy
    prefix = f"/sed-{uuid.uuid4().hex[:8]}"
    refuse = tmp_path / "refuse-restore"
    refuse.touch()
    with recorded_marks(pcmk, etcd, prefix, tmp_path, refuse) as log:
        daemons = start_daemons(nodes, etcd, prefix, hooks, ("node1", "node2"))
        first = nodes.sims["node1"].add_event("Reboot", ["node1"], not_before_in=3600)
        daemons["node1"].wait_log("slot_acquired", timeout=30, event_id=first)
        second = nodes.sims["node2"].add_event("Reboot", ["node2"], not_before_in=3600)
        daemons["node2"].wait_log("event_waiting", timeout=30, event_id=second, reason="slot")
        daemons["node1"].wait_log("cluster_restore_failed", timeout=60, event_id=first)
        time.sleep(6)  # tried again meanwhile; a slot given back reaches node2 in ~1 s
        assert pcmk.health("node1") == str(RED), "still marked: the restore was refused"
        refuse.unlink()  # the cluster takes updates again: the next try works
        daemons["node2"].wait_log("slot_released", timeout=60, event_id=second)
        worked = lambda: [  # noqa: E731
            m for m in read_marks(log) if m.node == "node1" and m.value == "0" and m.status == 0
        ]
        (restored,) = wait_for(worked, 60, "node1 restored by a retry")
        marks = read_marks(log)
    (marked, _) = [m for m in marks if m.node == "node2"]
    assert marked.value == str(RED)
    assert restored.end < marked.start, f"node2 marked while node1 still was: {marks}"
    assert marked.held_before == ["node2"]


def test_without_after_hooks_the_slot_is_still_given_back_only_once_the_node_is_restored(
    nodes,
    healthy,  # noqa: F811 - the fixture
    etcd,
    hooks,
    tmp_path,
):
    """The cluster is all the preparation (no after-hooks): the event's end restores the node
    and gives the slot back, in that order; node2 is marked only once node1 is back."""
    pcmk = healthy
    prefix = f"/sed-{uuid.uuid4().hex[:8]}"
    with recorded_marks(pcmk, etcd, prefix, tmp_path) as log:
        daemons = start_daemons(nodes, etcd, prefix, hooks, ("node1", "node2"), after_hooks=False)
        first = nodes.sims["node1"].add_event("Reboot", ["node1"], not_before_in=3600)
        daemons["node1"].wait_log("slot_acquired", timeout=30, event_id=first)
        second = nodes.sims["node2"].add_event("Reboot", ["node2"], not_before_in=3600)
        daemons["node2"].wait_log("event_waiting", timeout=30, event_id=second, reason="slot")
        daemons["node2"].wait_log("slot_released", timeout=60, event_id=second)
        restores = lambda: [m for m in read_marks(log) if m.value == "0"]  # noqa: E731
        wait_for(lambda: len(restores()) == 2, 30, "both restores recorded")
        marks = read_marks(log)
    (_, restored), (marked, _) = ([m for m in marks if m.node == n] for n in ("node1", "node2"))
    assert restored.status == 0
    assert restored.held_after == ["node1"], f"node1's slot gone before its restore: {marks}"
    assert restored.end < marked.start, f"node2 marked while node1 still was: {marks}"
