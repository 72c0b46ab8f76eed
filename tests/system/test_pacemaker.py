"""Pacemaker nodes, proven on a real 3-node corosync/pacemaker cluster (tests/pacemaker_cluster).

Each daemon runs inside its node's namespaces (the cluster tools talk over that node's abstract
sockets and /dev/shm); the simulator listens in the cluster's hub network, where every node
reaches it. What the tests assert about the cluster is read from the cluster itself (crm_mon),
at the instant the approval POST arrives.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from scheduledeventsd.host.store import read_status
from scheduledeventsd.simulators.azure import Simulator
from scheduledeventsd.simulators.scenario import Scenario
from tests.conftest import Daemon, DaemonFactory, Hooks, cli, stop_checked, wait_for
from tests.pacemaker_cluster import HUB_ADDRESS, RED, Cluster, Node, in_netns

pytestmark = [pytest.mark.pacemaker, pytest.mark.xdist_group("pacemaker")]
RESOURCES = ("d1", "d2", "d3", "d4")
ATTRIBUTE = "#health-scheduledevents"


@pytest.fixture(scope="module")
def cluster(pacemaker: Cluster) -> Cluster:
    pacemaker.add_dummies(len(RESOURCES), op_sleep=1)
    pacemaker.wait("every resource started", lambda: all(pacemaker.where(r) for r in RESOURCES))
    return pacemaker


@pytest.fixture
def healthy(cluster: Cluster) -> Cluster:
    """Every node up, unmarked and running resources, before each test (not after: the next
    test heals before it starts, and the module's cluster is destroyed after the last; the
    test that kills two nodes is last, so their restart, ~15 s, is not waited for)."""
    _heal(cluster)
    return cluster


def _heal(cluster: Cluster) -> None:
    for node in cluster.nodes:
        if not node.running:
            cluster.start(node)
    cluster.wait_online([n.name for n in cluster.nodes])
    via = cluster.nodes[0]
    for node in cluster.nodes:
        via.run("crm_attribute", "--node", node.name, "--name", ATTRIBUTE, "--update", "0",
                "--lifetime", "forever")  # fmt: skip
        via.run("crm_attribute", "--node", node.name, "--name", "standby", "--update", "off",
                "--lifetime", "forever")  # fmt: skip
    for resource in RESOURCES:
        via.run("crm_resource", "--resource", resource, "--meta", "--set-parameter",
                "is-managed", "--parameter-value", "true")  # fmt: skip
    cluster.wait("every resource running", lambda: all(cluster.where(r) for r in RESOURCES))


@pytest.fixture
def sim(cluster: Cluster) -> Any:
    """The simulator, listening in the hub network the nodes share."""
    simulator = Simulator(
        Scenario(vm_name="node1", start_after_approval=0.5, started_for=1.0), rate_limit=False
    )
    in_netns(cluster.hub, lambda: simulator.start(HUB_ADDRESS, 0))
    yield simulator
    simulator.stop()


class NodeDaemon(Daemon):
    """A daemon inside a node: `nsenter -p` forks, so signals go to the daemon itself."""

    @property
    def pid(self) -> int:
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        found = wait_for(lambda: children.read_text().split(), 10, "the daemon inside the node")
        return int(found[0])

    def wait_log(self, name: str, timeout: float = 10.0, **fields: Any) -> dict[str, Any]:
        """As Daemon's, with what this node's daemon said when it times out."""
        try:
            return super().wait_log(name, timeout, **fields)
        except AssertionError as e:
            raise AssertionError(f"{e}; the daemon said:\n{self.output()[-4000:]}") from None

    def signal(self, signo: int) -> None:
        os.kill(self.pid, signo)

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, AssertionError):
                self.signal(signal.SIGTERM)
        return super().stop(timeout)


class Nodes:
    """One daemon per cluster node, each with its own state directory and hooks."""

    def __init__(self, tmp_path: Path, sim: Simulator, cluster: Cluster, hooks: Hooks) -> None:
        self.tmp_path, self.sim, self.cluster, self.hooks = tmp_path, sim, cluster, hooks
        self.factories: dict[str, DaemonFactory] = {}
        self.daemons: dict[str, NodeDaemon] = {}

    def config(
        self, node: Node, environment: Optional[dict[str, str]] = None, **pacemaker: Any
    ) -> dict[str, Any]:
        factory = self.factory(node)
        before = self.hooks.make(
            f"{node.name}-before",
            f'sleep "${{BEFORE_SLEEP_{node.name}:-0}}"; date +%s.%N >> "$OUT/{node.name}.before"',
        )
        # What the cluster says of this node when its after-hooks start: restored first.
        after = self.hooks.make(
            f"{node.name}-after",
            f'mark=$(/usr/sbin/crm_attribute --node {node.name} --name "{ATTRIBUTE}" --query '
            f"--quiet --lifetime forever 2>/dev/null)\n"
            f'echo "$SCHEDULED_EVENT_STAGE $mark" >> "$OUT/{node.name}.after"',
        )
        return factory.config(
            vm_name=node.name,
            approve=pacemaker.pop("approve", "sole"),
            hooks={"before": [{"command": [before]}], "after": [{"command": [after]}]},
            events={
                t: {"before": ["before"], "after": ["after"], "cancelled": ["after"]}
                for t in ("Reboot", "Preempt", "Freeze")
            },
            cluster={"pacemaker": {"drain_timeout": 30, **pacemaker}},
            environment=environment or {},
            metrics_textfile=str(self.tmp_path / node.name / "metrics.prom"),
        )

    def factory(self, node: Node) -> DaemonFactory:
        if node.name not in self.factories:
            (self.tmp_path / node.name).mkdir(exist_ok=True)
            self.factories[node.name] = DaemonFactory(self.tmp_path / node.name, self.sim)
        return self.factories[node.name]

    def start(
        self, node: Node, cfg: Optional[dict[str, Any]] = None, **pacemaker: Any
    ) -> NodeDaemon:
        factory = self.factory(node)
        path = factory.write_config(cfg or self.config(node, **pacemaker))
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(Path(__file__).parents[2])}
        prefix = tuple(node.argv())
        daemon = NodeDaemon(path, env, prefix)
        factory.started.append(daemon)
        self.daemons[node.name] = daemon
        try:
            daemon.wait_log("document_changed", timeout=30)
        except AssertionError as e:
            raise AssertionError(f"{e}; {node.name} said:\n{daemon.output()[-3000:]}") from None
        return daemon

    def stop(self) -> None:
        stop_checked(self.factories.values())

    def metrics(self, node: Node) -> str:
        path = self.tmp_path / node.name / "metrics.prom"
        return path.read_text() if path.exists() else ""

    def before(self, node: Node) -> list[str]:
        """When its before-hooks ended (time.time())."""
        path = self.hooks.out / f"{node.name}.before"
        return path.read_text().splitlines() if path.exists() else []

    def after(self, node: Node) -> list[str]:
        path = self.hooks.out / f"{node.name}.after"
        return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def nodes(tmp_path: Path, sim: Simulator, healthy: Cluster, hooks: Hooks) -> Any:
    n = Nodes(tmp_path, sim, healthy, hooks)
    yield n
    n.stop()


def watch_approvals(
    sim: Simulator, cluster: Cluster, names: tuple[str, ...]
) -> list[dict[str, Any]]:
    """Record, in the instant each approval POST arrives, where every resource runs and how
    each node in `names` is marked (read from the cluster, before IMDS answers)."""
    seen: list[dict[str, Any]] = []
    original = sim._approve

    def approve(event_ids: list[str]) -> None:
        seen.append(
            {
                "at": time.time(),
                "event_ids": event_ids,
                "where": {r: cluster.where(r) for r in RESOURCES},
                "health": {n: cluster.health(n) for n in names},
            }
        )
        original(event_ids)

    sim._approve = approve  # type: ignore[method-assign]
    return seen


def resources_on(cluster: Cluster, name: str) -> list[str]:
    return [r for r in RESOURCES if name in cluster.where(r)]


def test_a_reboot_drains_the_node_before_approval_and_restores_it_after(nodes, sim, healthy):
    cluster = healthy
    node1 = cluster.node("node1")
    seen = watch_approvals(sim, cluster, ("node1",))
    daemon = nodes.start(node1)
    daemon.wait_log("cluster_ready", timeout=20)
    ready = wait_for(
        lambda: (
            "pacemaker: ready" in (r := cli("status", "--config", str(daemon.config_path))).stdout
            and r
        ),
        10,
        "status to show the cluster ready",
    )
    assert ready.returncode == 0, "the README's migration check passes"
    event_id = sim.add_event("Reboot", ["node1"], not_before_in=120)
    wait_for(lambda: seen, 60, "the approval")
    (at_approval,) = seen
    assert all("node1" not in where for where in at_approval["where"].values()), at_approval
    assert all(at_approval["where"].values()), "every resource runs elsewhere"
    assert at_approval["health"]["node1"] == str(RED)
    assert daemon.logs("cluster_drained")
    wait_for(lambda: event_id not in sim.event_ids(), 20, "the event to be over")
    wait_for(lambda: nodes.after(node1), 20, "the after-hooks")
    assert nodes.after(node1) == ["after 0"], "restored before the after-hooks ran"
    restored = daemon.wait_log("cluster_restored", timeout=20)
    assert restored["event_id"] == event_id
    assert cluster.health("node1") == "0"
    # It can take resources again: the cluster moves one there when asked.
    cluster.nodes[1].run("crm_resource", "--resource", "d1", "--move", "--node", "node1")
    try:
        cluster.wait("d1 back on node1", lambda: cluster.where("d1") == {"node1"}, 30)
    finally:
        cluster.nodes[1].run("crm_resource", "--resource", "d1", "--clear")


def test_a_shared_reboot_is_approved_once_every_node_it_names_is_drained(nodes, sim, healthy):
    cluster = healthy
    names = ("node1", "node2")
    seen = watch_approvals(sim, cluster, names)
    slow = {"BEFORE_SLEEP_node2": "3"}  # node1 asks the cluster while node2's hooks still run
    daemons = [nodes.start(cluster.node(n), approve="all", environment=slow) for n in names]
    event_id = sim.add_event("Reboot", list(names), not_before_in=120)
    wait_for(lambda: seen, 60, "the approval")
    first = seen[0]
    for name in names:
        assert first["health"][name] == str(RED), first
        assert all(name not in where for where in first["where"].values()), first
    assert all(where == {"node3"} for where in first["where"].values()), first
    before_done = max(float(line) for n in names for line in nodes.before(cluster.node(n)))
    assert first["at"] >= before_done, "approved only once both nodes' before-hooks ended"
    for daemon in daemons:
        assert daemon.logs("event_coordinating", via="pacemaker")
    wait_for(lambda: event_id not in sim.event_ids(), 20, "the event to be over")
    for name in names:
        wait_for(lambda n=name: cluster.health(n) == "0", 20, f"{name} restored")


def test_a_reboot_naming_every_node_is_held_never_approved_and_leaves_nothing_drained(
    nodes, sim, healthy
):
    cluster = healthy
    names = ("node1", "node2", "node3")
    daemons = [nodes.start(cluster.node(n), approve="all") for n in names]
    event_id = sim.add_event("Reboot", list(names), not_before_in=8)
    for daemon in daemons:
        hold = daemon.wait_log("cluster_hold", timeout=20)
        assert hold["reason"] == "too_few_healthy"
        assert daemon.wait_log("event_not_approved", timeout=20)["cause"] == "cluster_hold"
    assert {cluster.health(n) for n in names} <= {"", "0"}, "nothing was marked"
    wait_for(lambda: event_id not in sim.event_ids(), 30, "NotBefore to pass")
    assert not [a for a in sim.approvals if a.event_id == event_id]
    for name in names:
        wait_for(lambda n=name: nodes.after(cluster.node(n)), 20, f"{name}'s after-hooks")
        assert cluster.health(name) in ("", "0")
    assert all(cluster.where(r) for r in RESOURCES), "the cluster still runs everything"


def test_a_resource_that_cannot_leave_times_the_drain_out_no_approval_restored_after(
    nodes, sim, healthy
):
    cluster = healthy
    node1 = cluster.node("node1")
    pinned = resources_on(cluster, "node1")[0]
    node1.run("crm_resource", "--resource", pinned, "--meta", "--set-parameter", "is-managed",
              "--parameter-value", "false")  # fmt: skip
    daemon = nodes.start(node1, drain_timeout=4)
    event_id = sim.add_event("Reboot", ["node1"], not_before_in=15)
    draining = daemon.wait_log("cluster_draining", timeout=20, resources=[pinned])
    assert draining
    hold = daemon.wait_log("cluster_hold", timeout=20)
    assert hold["reason"] == "drain_timeout"
    assert daemon.wait_log("event_not_approved", timeout=20)["cause"] == "cluster_hold"
    assert cluster.health("node1") == str(RED), "left as it is for the maintenance"
    # Status and metrics say so too.
    status = wait_for(
        lambda: (s := read_status(nodes.factory(node1).state_dir))["pacemaker"]["held_for"] and s,
        10,
        "the status to show the hold",
    )
    assert status["pacemaker"]["held_for"] == [event_id]
    assert [e["cluster"] for e in status["events"]] == ["hold"]
    metrics = wait_for(lambda: nodes.metrics(node1), 10, "the metrics textfile")
    assert 'scheduledeventsd_cluster_drain{state="hold"} 1.0' in metrics
    wait_for(lambda: event_id not in sim.event_ids(), 30, "NotBefore to pass")
    assert not [a for a in sim.approvals if a.event_id == event_id]
    wait_for(lambda: nodes.after(node1), 20, "the after-hooks")
    assert nodes.after(node1) == ["after 0"]


def test_a_daemon_killed_mid_drain_converges_after_restart_and_restores_after_the_event(
    nodes, sim, healthy
):
    cluster = healthy
    node1 = cluster.node("node1")
    node1.run("crm_resource", "--resource", resources_on(cluster, "node1")[0], "--meta",
              "--set-parameter", "is-managed", "--parameter-value", "false")  # fmt: skip
    daemon = nodes.start(node1)
    event_id = sim.add_event("Reboot", ["node1"], not_before_in=60)
    daemon.wait_log("cluster_draining", timeout=20, resources=resources_on(cluster, "node1"))
    assert cluster.health("node1") == str(RED)
    daemon.signal(signal.SIGKILL)
    daemon.stop()
    again = nodes.start(node1, drain_timeout=4)
    assert not again.logs("cluster_restored"), "the mark of an event still on is kept"
    hold = again.wait_log("cluster_hold", timeout=20)
    assert hold["reason"] == "drain_timeout"
    sim.remove_event(event_id)  # Azure cancelled it
    wait_for(lambda: nodes.after(node1), 20, "the cancelled-hooks")
    assert nodes.after(node1) == ["cancelled 0"], "restored before the cancelled-hooks"
    assert again.wait_log("cluster_restored", timeout=10)["event_id"] == event_id


def test_a_health_mark_this_daemon_never_set_is_left_at_start(nodes, sim, healthy):
    """Issue 26 #7: only what the daemon set itself (its state file says so) is taken off; a
    -1000000 someone else wrote into its attribute stays."""
    cluster = healthy
    node1 = cluster.node("node1")
    node1.run("crm_attribute", "--node", "node1", "--name", ATTRIBUTE, "--update", str(RED),
              "--lifetime", "forever")  # fmt: skip
    daemon = nodes.start(node1)
    daemon.wait_log("cluster_ready", timeout=20)
    time.sleep(3)  # a restore at start would have run by now (measured: well under 1 s)
    assert not daemon.logs("cluster_restored")
    assert cluster.health("node1") == str(RED)


def test_an_operators_standby_is_left_on_when_the_event_is_over(nodes, sim, healthy):
    """Issue 26 #7: node1 in standby (the operator's) before a Reboot: the daemon finds it
    marked, sets nothing, and must not switch standby off at the event's end."""
    cluster = healthy
    node1 = cluster.node("node1")
    node1.run("crm_attribute", "--node", "node1", "--name", "standby", "--update", "on",
              "--lifetime", "forever")  # fmt: skip
    cluster.wait("node1 empty", lambda: not resources_on(cluster, "node1"), 30)
    daemon = nodes.start(node1, method="standby")
    event_id = sim.add_event("Reboot", ["node1"], not_before_in=60)
    wait_for(lambda: [a for a in sim.approvals if a.event_id == event_id], 30, "the approval")
    wait_for(lambda: event_id not in sim.event_ids(), 20, "the event to be over")
    wait_for(lambda: nodes.after(node1), 20, "the after-hooks")
    time.sleep(1)  # a restore in the background would have run by now
    assert cluster.standby("node1"), "the operator's standby stays on"
    assert not daemon.logs("cluster_restored")
    assert daemon.logs("cluster_draining", marked_by="someone else")


@contextlib.contextmanager
def refused_restore(node: Node, tmp_path: Path, update: str = "off", applied: bool = False) -> Any:
    """Inside `node` only (its mount namespace), `crm_attribute ... --update UPDATE` exits 102
    while the yielded file exists (`applied`: after the real tool did it, as a timeout can);
    everything else reaches the real tool."""
    refuse = tmp_path / "refuse-restore"
    real = tmp_path / "crm_attribute.real"
    shutil.copy("/usr/sbin/crm_attribute", real)
    wrapper = tmp_path / "crm_attribute"
    first = f'{real} "$@"; ' if applied else ""
    wrapper.write_text(
        "#!/bin/sh\n"
        f'case " $* " in *" --update {update} "*) [ -e {refuse} ] && '
        f'{{ {first}echo "injected: update refused" >&2; exit 102; }} ;; esac\n'
        f'exec {real} "$@"\n'
    )
    wrapper.chmod(0o755)
    refuse.touch()
    node.run("mount", "--bind", str(wrapper), "/usr/sbin/crm_attribute")
    try:
        yield refuse
    finally:
        node.run("umount", "/usr/sbin/crm_attribute", check=False)


def test_a_failed_restore_survives_a_restart_and_is_taken_off_then(nodes, sim, healthy, tmp_path):
    """Issue 26 #8a: method standby, the restore fails (crm_attribute exits 102), the daemon
    is restarted: the mark is in its state file, so the new daemon takes standby off."""
    cluster = healthy
    node1 = cluster.node("node1")
    with refused_restore(node1, tmp_path) as refuse:
        daemon = nodes.start(node1, method="standby")
        event_id = sim.add_event("Preempt", ["node1"], not_before_in=30)
        failed = daemon.wait_log("cluster_restore_failed", timeout=60, event_id=event_id)
        assert "exit 102" in failed["error"]
        # The event is over, its after-hooks done: only the mark is left to take off.
        wait_for(lambda: nodes.after(node1), 20, "the after-hooks")
        state_file = nodes.factory(node1).state_dir / "state.json"
        wait_for(
            lambda: all(
                e["phase"] != "after" for e in json.loads(state_file.read_text())["events"]
            ),
            10,
            "the after-stage to be recorded as over",
        )
        # `status` says so while it lasts.
        shown = wait_for(
            lambda: (r := cli("status", "--config", str(daemon.config_path))).returncode and r,
            10,
            "status to exit 1",
        )
        assert "cluster_restore_failed" in shown.stdout
        daemon.signal(signal.SIGKILL)
        daemon.stop()
        assert cluster.standby("node1"), "left on by the failure"
        refuse.unlink()  # the cluster takes updates again
        again = nodes.start(node1, method="standby")
        again.wait_log("cluster_restored", timeout=20)
        wait_for(lambda: not cluster.standby("node1"), 10, "standby off")
        stored = json.loads(state_file.read_text())
        assert stored["cluster_mark"] is None, "taken off, so no longer in the state file"


def test_a_reload_that_removes_pacemaker_while_drained_still_restores_the_node(nodes, sim, healthy):
    """Issue 26 #8b: SIGHUP without `cluster.pacemaker` while the node is drained: at the
    event's end #health is set back (the way it was set), before the after-hooks."""
    cluster = healthy
    node1 = cluster.node("node1")
    cfg = nodes.config(node1, environment={"BEFORE_SLEEP_node1": "6"})
    daemon = nodes.start(node1, cfg)
    event_id = sim.add_event("Reboot", ["node1"], not_before_in=120)
    daemon.wait_log("cluster_drained", timeout=30)
    assert cluster.health("node1") == str(RED)
    del cfg["cluster"]
    nodes.factory(node1).write_config(cfg)
    daemon.signal(signal.SIGHUP)
    daemon.wait_log("config_reloaded", timeout=10)
    wait_for(lambda: event_id not in sim.event_ids(), 40, "the event to be over")
    wait_for(lambda: nodes.after(node1), 20, "the after-hooks")
    assert nodes.after(node1) == ["after 0"], "restored before the after-hooks"
    assert cluster.health("node1") == "0"


def test_method_standby_drains_a_preempt_at_once_and_takes_standby_off_after(nodes, sim, healthy):
    cluster = healthy
    node1 = cluster.node("node1")
    seen = watch_approvals(sim, cluster, ())
    daemon = nodes.start(node1, method="standby")
    event_id = sim.add_event("Preempt", ["node1"], not_before_in=30)
    wait_for(lambda: seen, 30, "the approval")
    assert all("node1" not in where for where in seen[0]["where"].values()), seen
    assert daemon.logs("cluster_drained")
    wait_for(lambda: event_id not in sim.event_ids(), 20, "the event to be over")
    wait_for(lambda: nodes.after(node1), 20, "the after-hooks")
    assert not cluster.standby("node1")
    assert cluster.health("node1") in ("", "0"), "the health attribute was never touched"


def test_without_node_health_strategy_the_daemon_says_what_to_set(nodes, sim, healthy):
    cluster = healthy
    via = cluster.nodes[1]
    via.run("crm_attribute", "--type", "crm_config", "--name", "node-health-strategy", "--delete")
    try:
        daemon = nodes.start(cluster.node("node1"))
        unready = daemon.wait_log("cluster_unready", timeout=20)
        (problem,) = unready["problems"]
        assert "node-health-strategy is not set" in problem
        assert "--name node-health-strategy --update custom" in problem
        shown = wait_for(
            lambda: (r := cli("status", "--config", str(daemon.config_path))).returncode and r,
            10,
            "status to exit 1",
        )
        assert "pacemaker: cluster_unready" in shown.stdout
        assert "PROBLEM: cluster_unready: node-health-strategy is not set" in shown.stdout
    finally:
        via.run("crm_attribute", "--type", "crm_config", "--name", "node-health-strategy",
                "--update", "custom")  # fmt: skip


def test_a_mark_whose_command_failed_after_applying_it_is_still_taken_off(
    nodes, sim, healthy, tmp_path
):
    """Only a mark of ours is taken off, so a `crm_attribute` that set standby and then failed
    (timed out) must count as ours: held (tool_failed), and restored at the event's end."""
    cluster = healthy
    node1 = cluster.node("node1")
    with refused_restore(node1, tmp_path, update="on", applied=True):
        daemon = nodes.start(node1, method="standby")
        event_id = sim.add_event("Preempt", ["node1"], not_before_in=8)
        assert daemon.wait_log("cluster_hold", timeout=20)["reason"] == "tool_failed"
        assert cluster.standby("node1"), "applied, whatever the exit status said"
        wait_for(lambda: event_id not in sim.event_ids(), 30, "the event to be over")
        wait_for(lambda: nodes.after(node1), 20, "the after-hooks")
        daemon.wait_log("cluster_restored", timeout=20)
        assert not cluster.standby("node1")
    assert not [a for a in sim.approvals if a.event_id == event_id]


def test_a_failed_restore_retried_later_never_takes_the_mark_off_under_the_next_drain(
    nodes, sim, healthy, tmp_path
):
    """Review of issue 27: an event's restore fails (crm_attribute exits 102) and the drainer
    tries it again with backoff; a second event drains the node meanwhile (the mark found set,
    ours, watched on). Once the cluster took updates again, the first event's retry took the
    mark off while the second event's before-hooks ran: resources could come back to a node
    about to go down. Now a drain stops the retries (the engine restores the node when that
    event is over): the node stays marked until then, and is restored after it."""
    cluster = healthy
    node1 = cluster.node("node1")
    cfg = nodes.config(node1)
    pause = tmp_path / "before-sleep"
    nodes.hooks.make(  # the before-hooks of node1 sleep as long as this file says
        "node1-before",
        f'sleep "$(cat {pause} 2>/dev/null || echo 0)"; date +%s.%N >> "$OUT/node1.before"',
    )
    with refused_restore(node1, tmp_path, update="0") as refuse:
        daemon = nodes.start(node1, cfg)
        first = sim.add_event("Preempt", ["node1"], not_before_in=30)
        daemon.wait_log("cluster_restore_failed", timeout=60, event_id=first)
        wait_for(lambda: nodes.after(node1), 20, "the first event's after-hooks")
        pause.write_text("12")
        second = sim.add_event("Preempt", ["node1"], not_before_in=60)
        daemon.wait_log("cluster_drained", timeout=30, event_id=second)
        refuse.unlink()  # the cluster takes updates again: a retry now would work
        while len(nodes.before(node1)) < 2:  # the second event's before-hooks run
            assert cluster.health("node1") == str(RED), "the mark taken off under a drain"
            time.sleep(0.25)
    wait_for(lambda: len(nodes.after(node1)) == 2, 30, "the second event's after-hooks")
    assert nodes.after(node1) == [f"after {RED}", "after 0"], "restored before, at the end"
    assert daemon.wait_log("cluster_restored", timeout=10)["event_id"] == second
    assert cluster.health("node1") == "0"


# Last of the module: it leaves two nodes killed, and nothing heals them after it.
def test_with_one_node_down_a_reboot_still_drains_and_without_quorum_nothing_is_approved(
    nodes, sim, healthy
):
    cluster = healthy
    node1, node2, node3 = cluster.nodes
    cluster.kill(node3)
    cluster.wait("node3 offline", lambda: "node3" not in cluster.online(node1), 30)
    seen = watch_approvals(sim, cluster, ("node1",))
    daemon = nodes.start(node1)
    event_id = sim.add_event("Reboot", ["node1"], not_before_in=120)
    wait_for(lambda: seen, 60, "the approval with 2 of 3 nodes")
    assert all(where == {"node2"} for where in seen[0]["where"].values()), seen
    wait_for(lambda: event_id not in sim.event_ids(), 20, "the event to be over")
    daemon.wait_log("cluster_restored", timeout=20)
    cluster.kill(node2)  # node1 alone: a partition without quorum
    cluster.wait("node1 without quorum", lambda: not _quorate(cluster, node1), 30)
    second = sim.add_event("Reboot", ["node1"], not_before_in=8)
    hold = daemon.wait_log("cluster_hold", timeout=20, event_id=second)
    assert hold["reason"] == "no_quorum"
    wait_for(lambda: second not in sim.event_ids(), 30, "NotBefore to pass")
    assert not [a for a in sim.approvals if a.event_id == second]


def _quorate(cluster: Cluster, via: Node) -> bool:
    from scheduledeventsd.coordination.pacemaker import parse_status  # noqa: PLC0415

    return parse_status(cluster.crm_mon(via)).quorate
