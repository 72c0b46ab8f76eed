"""A real 3-node corosync/Pacemaker cluster on one machine, for tests and the bench.

Each node is its own network, mount, UTS and PID namespace (the recipe measured in
`../shared/machine-notes.md`): a hub namespace holds a bridge, every node a veth to it at
169.254.100.1N. The hub also holds the address the IMDS simulator listens on, so the daemons
inside the nodes reach it; the test binds the simulator's socket in the hub from a thread that
entered it, so nothing is added to the machine's own network. Cluster tools (and the daemon
under test) run through `Node.argv`, inside the node's namespaces: their IPC is abstract sockets
of the node's network namespace plus its /dev/shm.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, TypeVar

import pytest

from scheduledeventsd.coordination.pacemaker import parse_status

TOOLS = ("corosync", "pacemakerd", "crm_mon", "crm_attribute", "crm_node", "crm_resource")
PACKAGES = ("pacemaker", "pacemaker-cli-utils", "corosync", "resource-agents")
SUBNET = "169.254.100"
HUB_ADDRESS = f"{SUBNET}.100"
RED = -1000000
CLONE_NEWNET = 0x40000000
T = TypeVar("T")

COROSYNC_CONF = """\
totem {{
    version: 2
    cluster_name: sedtest
    transport: knet
    token: 1000
    crypto_cipher: aes256
    crypto_hash: sha256
}}
nodelist {{
{nodes}
}}
quorum {{
    provider: corosync_votequorum
}}
logging {{
    to_logfile: yes
    logfile: /var/log/corosync/corosync.log
    to_stderr: no
    to_syslog: no
    timestamp: on
}}
system {{
    sched_rr: no
}}
"""

NODE_ENTRY = """\
    node {{
        name: {name}
        nodeid: {nodeid}
        ring0_addr: {address}
    }}"""

# Quorum and a DC in ~5 s (dc-deadtime), resources start without fencing, health attributes
# count: what an operator sets once for the daemon's `method: health`.
CIB = """\
<cib validate-with="pacemaker-3.9" epoch="1" num_updates="0"
     admin_epoch="0">
  <configuration>
    <crm_config>
      <cluster_property_set id="cib-bootstrap-options">
        <nvpair id="o-stonith" name="stonith-enabled" value="false"/>
        <nvpair id="o-dc" name="dc-deadtime" value="2s"/>
        {health}
      </cluster_property_set>
    </crm_config>
    <nodes/>
    <resources/>
    <constraints/>
  </configuration>
  <status/>
</cib>
"""
DUMMY = (
    '<primitive id="{name}" class="ocf" provider="pacemaker" type="Dummy">'
    '<instance_attributes id="{name}-ia">'
    '<nvpair id="{name}-sleep" name="op_sleep" value="{op_sleep}"/></instance_attributes>'
    '<operations><op id="{name}-mon" name="monitor" interval="10s" timeout="20s"/></operations>'
    "</primitive>"
)
HEALTH = '<nvpair id="o-health" name="node-health-strategy" value="custom"/>'

# PID 1 of a node: its own host name (the cluster's node name) and private copies of every
# directory the cluster writes; /run and /dev/shm private too (Dummy keeps its state in /run,
# libqb its rings in /dev/shm). It reaps orphans by waiting.
INIT = """\
set -e
hostname {name}
for d in /etc/corosync /var/lib/corosync /var/log/corosync /var/lib/pacemaker \\
         /var/log/pacemaker; do
    mount --bind {root}$d $d
done
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /dev/shm
mkdir -p /run/crm /run/resource-agents
chown hacluster:haclient /run/crm
corosync -f &
for i in $(seq 100); do corosync-cfgtool -s >/dev/null 2>&1 && break; sleep 0.1; done
pacemakerd &
wait
"""


def missing() -> Optional[str]:
    """Why a cluster cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (namespaces)"
    lacking = [t for t in TOOLS if shutil.which(t, path="/usr/sbin:/usr/bin:/sbin:/bin") is None]
    return f"missing {', '.join(lacking)} (apt: {' '.join(PACKAGES)})" if lacking else None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def in_netns(netns: str, work: Callable[[], T]) -> T:
    """`work()` run by a thread that entered `netns` (a name of `ip netns`, or a path such as
    /proc/PID/ns/net): sockets it makes stay in that namespace, while the test process itself
    stays where it is."""
    libc = ctypes.CDLL(None, use_errno=True)
    out: list[T] = []
    errors: list[BaseException] = []

    def enter() -> None:
        fd = os.open(netns if netns.startswith("/") else f"/run/netns/{netns}", os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns {netns}")
        finally:
            os.close(fd)
        try:
            out.append(work())
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            errors.append(e)

    thread = threading.Thread(target=enter, name=f"netns-{netns}")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return out[0]


@dataclass
class Node:
    name: str
    nodeid: int
    address: str
    root: Path
    netns: str
    proc: Optional[subprocess.Popen[bytes]] = None

    @property
    def init_pid(self) -> int:
        """The node's PID 1 as the machine sees it (the child of `unshare`)."""
        assert self.proc is not None
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        for _ in range(100):
            found = children.read_text().split()
            if found:
                return int(found[0])
            time.sleep(0.05)
        raise RuntimeError(f"{self.name}: no init process")

    def argv(self, *command: str) -> list[str]:
        """`command` inside this node (network, mount, UTS and PID namespaces); with no command,
        the prefix that puts one there."""
        return ["nsenter", "-t", str(self.init_pid), "-n", "-m", "-u", "-p", "--", *command]

    def run(self, *command: str, check: bool = True, timeout: float = 30) -> str:
        done = subprocess.run(
            self.argv(*command), capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{self.name}: {command}: {done.returncode}: {done.stderr}")
        return done.stdout

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class Cluster:
    root: Path
    tag: str
    nodes: list[Node] = field(default_factory=list)

    @property
    def hub(self) -> str:
        return f"{self.tag}-hub"

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    # ---- life ---------------------------------------------------------------------------

    def create(self, *, count: int = 3, health_strategy: bool = True) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        _ip("netns", "add", self.hub)
        _ip("-n", self.hub, "link", "set", "lo", "up")
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "addr", "add", f"{HUB_ADDRESS}/24", "dev", "br0")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        key = self.root / "authkey"
        subprocess.run(
            ["corosync-keygen", "-l", "-k", str(key)], check=True, capture_output=True, timeout=60
        )
        for i in range(1, count + 1):
            name = f"node{i}"
            netns = f"{self.tag}-{name}"
            node = Node(name, i, f"{SUBNET}.1{i}", self.root / name, netns)
            _ip("netns", "add", netns)
            _ip("-n", netns, "link", "set", "lo", "up")
            _ip("-n", self.hub, "link", "add", f"veth{i}", "type", "veth", "peer", "name", "eth0",
                "netns", netns)  # fmt: skip
            _ip("-n", self.hub, "link", "set", f"veth{i}", "master", "br0", "up")
            _ip("-n", netns, "addr", "add", f"{node.address}/24", "dev", "eth0")
            _ip("-n", netns, "link", "set", "eth0", "up")
            self.nodes.append(node)
        entries = "\n".join(
            NODE_ENTRY.format(name=n.name, nodeid=n.nodeid, address=n.address) for n in self.nodes
        )
        for node in self.nodes:
            self._lay_out(node, key, COROSYNC_CONF.format(nodes=entries), health_strategy)
            self.start(node)

    def _lay_out(self, node: Node, key: Path, conf: str, health_strategy: bool) -> None:
        r = node.root
        for d in ("etc/corosync", "var/lib/corosync", "var/log/corosync", "var/log/pacemaker"):
            (r / d).mkdir(parents=True, exist_ok=True)
        for d in ("cib", "pengine", "blackbox", "cores"):
            (r / "var/lib/pacemaker" / d).mkdir(parents=True, exist_ok=True)
        (r / "etc/corosync/corosync.conf").write_text(conf)
        shutil.copy(key, r / "etc/corosync/authkey")
        os.chmod(r / "etc/corosync/authkey", 0o400)
        (r / "var/lib/pacemaker/cib/cib.xml").write_text(
            CIB.format(health=HEALTH if health_strategy else "")
        )
        subprocess.run(
            ["chown", "-R", "hacluster:haclient", str(r / "var/lib/pacemaker"),
             str(r / "var/log/pacemaker")],
            check=True, timeout=30,
        )  # fmt: skip
        (r / "init.sh").write_text(textwrap.dedent(INIT.format(name=node.name, root=r)))

    def start(self, node: Node) -> None:
        log = (node.root / "init.log").open("ab")
        node.proc = subprocess.Popen(
            ["setpriv", "--pdeathsig", "KILL", "nsenter", f"--net=/run/netns/{node.netns}",
             "unshare", "--mount", "--uts", "--pid", "--fork", "--kill-child", "--mount-proc",
             "sh", str(node.root / "init.sh")],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log,
        )  # fmt: skip

    def kill(self, node: Node) -> None:
        """The whole node at once (its PID namespace dies with its init): a crash."""
        if node.proc is not None and node.proc.poll() is None:
            os.kill(node.init_pid, 9)
            node.proc.wait(30)

    def destroy(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                self.kill(node)
        for netns in [n.netns for n in self.nodes] + [self.hub]:
            subprocess.run(
                ["ip", "netns", "del", netns], capture_output=True, timeout=30, check=False
            )

    # ---- reading it ---------------------------------------------------------------------

    def wait(self, what: str, check: Callable[[], bool], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if check():
                    return
            time.sleep(0.2)
        raise TimeoutError(f"cluster: {what} after {timeout} s")

    def crm_mon(self, via: Optional[Node] = None) -> str:
        node = via or next(n for n in self.nodes if n.running)
        return node.run("crm_mon", "--output-as=xml", "--one-shot", check=False)

    def online(self, via: Optional[Node] = None) -> set[str]:
        return {n.name for n in parse_status(self.crm_mon(via)).nodes.values() if n.online}

    def wait_online(self, names: Sequence[str], timeout: float = 90) -> None:
        self.wait(f"{sorted(names)} online", lambda: set(names) <= self.online(), timeout)

    def where(self, resource: str, via: Optional[Node] = None) -> set[str]:
        """Nodes on which `resource` is active now (crm_mon's own reading)."""
        active = parse_status(self.crm_mon(via)).active
        return {node for node, resources in active.items() if resource in resources}

    def health(self, name: str, attribute: str = "#health-scheduledevents") -> str:
        """The node's health attribute as the cluster holds it ("" when unset)."""
        via = next(n for n in self.nodes if n.running)
        return via.run(
            "crm_attribute", "--node", name, "--name", attribute, "--query", "--quiet",
            "--lifetime", "forever", check=False,
        ).strip()  # fmt: skip

    def standby(self, name: str) -> bool:
        via = next(n for n in self.nodes if n.running)
        value = via.run(
            "crm_attribute", "--node", name, "--name", "standby", "--query", "--quiet",
            "--lifetime", "forever", check=False,
        ).strip()  # fmt: skip
        return value in ("on", "true", "1")

    def add_dummies(self, count: int, op_sleep: float = 1.0) -> list[str]:
        """`ocf:pacemaker:Dummy` resources whose start and stop take `op_sleep` seconds."""
        names = [f"d{i}" for i in range(1, count + 1)]
        via = next(n for n in self.nodes if n.running)
        for name in names:
            via.run(
                "cibadmin",
                "--create",
                "-o",
                "resources",
                "--xml-text",
                DUMMY.format(name=name, op_sleep=op_sleep),
            )
        return names


def tag() -> str:
    return "sedpc" + uuid.uuid4().hex[:5]


@pytest.fixture(scope="module")
def pacemaker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    why = missing()
    if why is not None:
        pytest.fail(f"a Pacemaker cluster cannot run: {why}")
    cluster = Cluster(tmp_path_factory.mktemp("pacemaker"), tag())
    try:
        cluster.create()
        cluster.wait_online([n.name for n in cluster.nodes])
        yield cluster
    finally:
        cluster.destroy()
