"""Pacemaker as the daemon sees it, through the cluster's own CLI.

What `crm_mon --output-as=xml` and `crm_simulate -LS` say is parsed here into frozen values, and
the judgements on them are pure functions (may this node be drained, is it drained yet), so they
are tested without a cluster. `Cli` runs the few commands, argv only, with a timeout, through the
daemon's one process runner. The daemon only says "this node is going away" (a `#health-*`
attribute of -1000000, or standby) and waits for the cluster to agree: where the resources go is
the cluster's decision, and cluster-wide properties are never changed here.
"""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Optional

from ..config import DrainMethod, Pacemaker
from ..config.fleet import CLUSTER_TOOLS, TOOL_PATH
from ..host.hooks import OutputBudget, ProcessRunner

TOOL_TIMEOUT = 30.0  # seconds; crm_mon answers in well under one
RED = -1000000  # Pacemaker's -INFINITY: no resource may run on the node
# A transient node attribute (gone when the node reboots): the EventId whose before-hooks this
# node finished, which the other nodes of a shared event read before approving it.
READY = "scheduledevents-ready"
MAX_OUTPUT = 8 * 1024 * 1024
# Roles of a resource an operation is under way for: the cluster has not settled.
_MOVING_ROLES = frozenset({"Starting", "Stopping", "Migrating", "Promoting", "Demoting"})


class ClusterError(Exception):
    """A cluster command failed, timed out, or said something that cannot be read."""


@dataclass(frozen=True)
class ClusterNode:
    name: str
    online: bool
    standby: bool
    healthy: bool  # not red, not in maintenance, not unclean, not shutting down

    @property
    def can_host(self) -> bool:
        """Would stay to run resources while another node is drained."""
        return self.online and not self.standby and self.healthy


@dataclass(frozen=True)
class View:
    """One reading of the cluster from this node."""

    quorate: bool
    nodes: Mapping[str, ClusterNode]
    active: Mapping[str, tuple[str, ...]]  # node name -> resources active there
    moving: tuple[str, ...]  # resources with an operation under way, anywhere
    attributes: Mapping[str, Mapping[str, str]]  # node -> its transient attributes

    def node(self, name: str) -> Optional[ClusterNode]:
        """A node by name, case-insensitive as Azure's names are."""
        found = self.nodes.get(name)
        if found is None:
            folded = name.casefold()
            found = next((n for k, n in self.nodes.items() if k.casefold() == folded), None)
        return found


def parse_status(text: str) -> View:
    """`crm_mon --output-as=xml`; anything unreadable is a ClusterError, never another error."""
    if "<!DOCTYPE" in text or "<!ENTITY" in text:  # crm_mon never declares any
        raise ClusterError("crm_mon's answer declares a DTD or entities: refused")
    try:
        root = ET.fromstring(text)  # noqa: S314 - root's own tool; no DTD, hence no entities
    except (ET.ParseError, ValueError) as e:
        raise ClusterError(f"crm_mon said something that is not XML: {e}") from None
    dc = root.find("./summary/current_dc")
    quorate = dc is not None and dc.get("present") == "true" and dc.get("with_quorum") == "true"
    nodes: dict[str, ClusterNode] = {}
    for n in root.findall("./nodes/node"):
        name = n.get("name") or ""
        if not name:
            continue
        flag = {k: n.get(k) == "true" for k in ("online", "standby", "maintenance", "unclean")}
        healthy = (
            n.get("health", "green") != "red"
            and not flag["maintenance"]
            and not flag["unclean"]
            and n.get("shutdown") != "true"
            and n.get("pending") != "true"
        )
        nodes[name] = ClusterNode(name, flag["online"], flag["standby"], healthy)
    active: dict[str, list[str]] = {}
    moving: list[str] = []
    resources = root.find("./resources")
    for r in resources.iter("resource") if resources is not None else ():
        rid = r.get("id") or "?"
        if r.get("role") in _MOVING_ROLES or r.get("pending"):
            moving.append(rid)
        if r.get("active") != "true":
            continue
        for where in r.findall("node"):
            active.setdefault(where.get("name") or "", []).append(rid)
    if dc is None and not nodes:
        raise ClusterError("crm_mon's answer holds no cluster (no summary, no nodes)")
    attributes = {
        n.get("name") or "": {
            a.get("name") or "": a.get("value") or "" for a in n.findall("attribute")
        }
        for n in root.findall("./node_attributes/node")
    }
    return View(quorate, nodes, {k: tuple(v) for k, v in active.items()}, tuple(moving), attributes)


def transitions(text: str) -> tuple[str, ...]:
    """The actions of `crm_simulate -LS`'s Transition Summary: what the cluster still plans."""
    planned: list[str] = []
    inside = False
    for line in text.splitlines():
        if line.startswith("Transition Summary"):
            inside = True
        elif inside and line.strip().startswith("*"):
            planned.append(line.strip().lstrip("* ").strip())
        elif inside and line.strip() and not line.startswith(" "):
            break
    return tuple(planned)


def why_not_drain(view: View, me: str, going: Iterable[str], min_healthy: int) -> Optional[str]:
    """The reason this node may not be drained now, or None. `going`: the other nodes the same
    event takes away (they will not be there to run anything either)."""
    if not view.quorate:
        return "no_quorum"
    if view.node(me) is None:
        return "node_unknown"
    away = {g.casefold() for g in going} | {me.casefold()}
    staying = [n for n in view.nodes.values() if n.name.casefold() not in away and n.can_host]
    if len(staying) < min_healthy:
        return "too_few_healthy"
    return None


def still_here(view: View, me: str) -> tuple[str, ...]:
    """What keeps this node from being drained: resources active on it, and any resource the
    cluster is still starting or stopping (a move is not over until its start elsewhere is)."""
    node = view.node(me)
    here = view.active.get(node.name if node is not None else me, ())
    return tuple(dict.fromkeys((*here, *view.moving)))


def is_ready(view: View, name: str, settings: Pacemaker, event_id: str) -> bool:
    """A node named by a shared event: marked as going away, running nothing, and its
    before-hooks for this event done (its READY attribute)."""
    node = view.node(name)
    if node is None:
        return False
    marked = node.standby if settings.method is DrainMethod.STANDBY else not node.healthy
    done = view.attributes.get(node.name, {}).get(READY) == event_id
    return marked and done and not view.active.get(node.name) and not view.moving


class Cli:
    """The cluster's CLI, argv only, each call bounded by TOOL_TIMEOUT."""

    def __init__(self, settings: Pacemaker, runner: ProcessRunner) -> None:
        self.settings = settings
        self._runner = runner
        self._tools = {t: shutil.which(t, path=TOOL_PATH) for t in CLUSTER_TOOLS}

    def run(self, tool: str, *args: str) -> str:
        path = self._tools.get(tool)
        if path is None:
            raise ClusterError(f"{tool} not found in {TOOL_PATH}")
        lines: list[str] = []
        errors: list[str] = []

        def collect(stream: str, line: str) -> None:
            (lines if stream == "stdout" else errors).append(line)

        result = self._runner.run(
            (path, *args),
            {"PATH": TOOL_PATH, "LC_ALL": "C"},
            b"",
            TOOL_TIMEOUT,
            collect,
            budget=OutputBudget(lines=1_000_000, size=MAX_OUTPUT),
        )
        if not result.succeeded:
            why = "timed out" if result.timed_out else result.error or f"exit {result.exit_status}"
            said = " ".join(errors)[-300:]
            raise ClusterError(f"{tool} {' '.join(args)}: {why}{': ' + said if said else ''}")
        return "\n".join(lines)

    def me(self) -> str:
        name = self.run("crm_node", "--name").strip()
        if not name:
            raise ClusterError("crm_node --name said nothing")
        return name

    def status(self) -> View:
        return parse_status(
            self.run("crm_mon", "--one-shot", "--output-as=xml", "--include=attributes")
        )

    def planned(self) -> tuple[str, ...]:
        return transitions(self.run("crm_simulate", "--live-check", "--simulate"))

    def health_strategy(self) -> str:
        """The cluster property, "" when unset (crm_attribute exits non-zero then)."""
        try:
            return self.run(
                "crm_attribute", "--type", "crm_config", "--name", "node-health-strategy",
                "--query", "--quiet",
            ).strip()  # fmt: skip
        except ClusterError:
            return ""

    def mark(self, node: str, *, away: bool) -> None:
        """This node is going away (or back): the health attribute or standby, for good (not
        until the node reboots: the maintenance reboots it, and it must not take resources
        back before its event is over)."""
        if self.settings.method is DrainMethod.STANDBY:
            name, value = "standby", "on" if away else "off"
        else:
            name, value = self.settings.attribute, str(RED) if away else "0"
        self.run(
            "crm_attribute", "--node", node, "--name", name, "--update", value,
            "--lifetime", "forever",
        )  # fmt: skip

    def ready(self, node: str, event_id: str) -> None:
        """This node's before-hooks for the event are done (until the node reboots)."""
        self.run(
            "crm_attribute", "--node", node, "--name", READY, "--update", event_id,
            "--lifetime", "reboot",
        )  # fmt: skip

    def marked(self, node: str) -> bool:
        """Whether our mark is on the node now (read back from the cluster)."""
        name = "standby" if self.settings.method is DrainMethod.STANDBY else self.settings.attribute
        try:
            value = self.run(
                "crm_attribute", "--node", node, "--name", name, "--query", "--quiet",
                "--lifetime", "forever",
            ).strip()  # fmt: skip
        except ClusterError:
            return False  # not set at all
        return value in ("on", "true", "1") if name == "standby" else value == str(RED)


def problems(cli: Cli) -> list[str]:
    """What an operator must fix before this node can be drained (checked at start and every
    minute; `status` exits 1 while there is any)."""
    found: list[str] = []
    try:
        me = cli.me()
        view = cli.status()
    except ClusterError as e:
        return [f"the cluster cannot be read: {e}"]
    if not view.quorate:
        found.append("the cluster has no quorum (or no DC) seen from this node")
    if view.node(me) is None:
        found.append(f"this node ({me}) is not a member of the cluster")
    elif why_not_drain(view, me, (), cli.settings.min_healthy) == "too_few_healthy":
        found.append(
            f"fewer than min_healthy ({cli.settings.min_healthy}) other nodes are online, not "
            "in standby and healthy: this node cannot be drained"
        )
    if cli.settings.method is DrainMethod.HEALTH:
        strategy = cli.health_strategy()
        if strategy in ("", "none"):
            found.append(
                "node-health-strategy is not set, so Pacemaker ignores the #health-* attribute: "
                "set it once for the cluster (crm_attribute --type crm_config --name "
                "node-health-strategy --update custom), or use method: standby"
            )
    return found
