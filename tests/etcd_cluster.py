"""A real 3-member etcd cluster on loopback (Debian's etcd-server), for tests and the bench.

Members are started with `setpriv --pdeathsig KILL`, so a killed test run leaves none behind;
each can be killed and started again on its data directory, which is how the tests take away
one member or the quorum.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, TypeVar

import pytest
import requests

ETCD = "/usr/bin/etcd"
T = TypeVar("T")


def free_ports(count: int) -> list[int]:
    """Ports the kernel hands out now; held open together so no two are the same."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass(frozen=True)
class Tls:
    """Files of a CA made for one test run: the servers' and a client's certificate."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_tls(root: Path) -> Tls:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, with openssl.

    The server certificate is also a client one: etcd's JSON gateway dials its own gRPC port
    with it."""
    root.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=root)

    run(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
        "-keyout", "ca.key", "-out", "ca.pem",
    )  # fmt: skip
    # With auth enabled, etcd's gateway refuses a client certificate with a CommonName (it
    # could not pass the CN on as the user), so the client's subject has none.
    for name, subject, ext in (
        (
            "server",
            "/CN=server",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth",
        ),
        ("client", "/O=scheduledeventsd", "extendedKeyUsage=clientAuth"),
    ):
        (root / f"{name}.ext").write_text(ext + "\n")
        run(
            "req", "-newkey", "rsa:2048", "-nodes", "-subj", subject,
            "-keyout", f"{name}.key", "-out", f"{name}.csr",
        )  # fmt: skip
        run(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem",
        )  # fmt: skip
    return Tls(
        root / "ca.pem",
        root / "server.pem",
        root / "server.key",
        root / "client.pem",
        root / "client.key",
    )


class Cluster:
    """Three members; `endpoints` are their client URLs.

    With `netns` (a name of `ip netns`) the members run inside that network namespace and
    listen on `host` there: a Pacemaker cluster's hub (tests/pacemaker_cluster), which every
    node reaches. `argv` and `in_net` then put a client (etcdctl, requests) there too."""

    def __init__(
        self,
        root: Path,
        tls: Optional[Tls] = None,
        size: int = 3,
        host: str = "127.0.0.1",
        netns: Optional[str] = None,
    ) -> None:
        self.root = root
        self.tls = tls
        self.netns = netns
        ports = free_ports(2 * size)
        self.client_ports = ports[:size]
        self.peer_ports = ports[size:]
        scheme = "https" if tls else "http"
        self.host = host
        self.endpoints = [f"{scheme}://{host}:{p}" for p in self.client_ports]
        self.names = [f"m{i}" for i in range(size)]
        self.initial = ",".join(
            f"{n}=http://{host}:{p}" for n, p in zip(self.names, self.peer_ports)
        )
        self.procs: list[Optional[subprocess.Popen[bytes]]] = [None] * size
        self._started_once = [False] * size

    def start(self, i: Optional[int] = None) -> None:
        for k in range(len(self.names)) if i is None else [i]:
            self._start(k)

    def _start(self, i: int) -> None:
        if self.procs[i] is not None and self.procs[i].poll() is None:  # type: ignore[union-attr]
            return
        name = self.names[i]
        client = self.endpoints[i]
        peer = f"http://{self.host}:{self.peer_ports[i]}"
        argv = [
            "setpriv", "--pdeathsig", "KILL", *self.argv(), ETCD,
            "--name", name,
            "--data-dir", str(self.root / name),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", self.initial,
            "--initial-cluster-state", "existing" if self._started_once[i] else "new",
            "--initial-cluster-token", f"sed-test-{self.client_ports[0]}",
            "--heartbeat-interval", "50",
            "--election-timeout", "500",
            "--logger", "zap",
            "--log-outputs", str(self.root / f"{name}.log"),
        ]  # fmt: skip
        if self.tls is not None:
            argv += [
                "--cert-file", str(self.tls.server_cert),
                "--key-file", str(self.tls.server_key),
                "--client-cert-auth",
                "--trusted-ca-file", str(self.tls.ca),
            ]  # fmt: skip
        self.root.mkdir(parents=True, exist_ok=True)
        self.procs[i] = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self._started_once[i] = True

    def kill(self, i: Optional[int] = None) -> None:
        for k in range(len(self.names)) if i is None else [i]:
            proc = self.procs[k]
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()

    def stop(self) -> None:
        self.kill()

    def argv(self, *command: str) -> list[str]:
        """`command` in the members' network namespace (as is, without one); `nsenter` execs
        it, so a member's process is etcd itself (killed as such, and by its pdeathsig)."""
        prefix = ["nsenter", f"--net=/run/netns/{self.netns}"] if self.netns else []
        return [*prefix, *command]

    def in_net(self, work: Callable[[], T]) -> T:
        """`work()` where the members can be reached (a thread in their namespace)."""
        if self.netns is None:
            return work()
        from tests.pacemaker_cluster import in_netns  # noqa: PLC0415 - only with a namespace

        return in_netns(self.netns, work)

    def session(self) -> requests.Session:
        s = requests.Session()
        s.trust_env = False
        if self.tls is not None:
            s.verify = str(self.tls.ca)
            s.cert = (str(self.tls.client_cert), str(self.tls.client_key))
        return s

    def healthy(self, timeout: float = 30.0) -> None:
        """Wait until a write goes through on every live member's endpoint (a quorum)."""
        self.in_net(lambda: self._healthy(timeout))

    def _healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.session() as s:
            for i, endpoint in enumerate(self.endpoints):
                if self.procs[i] is None or self.procs[i].poll() is not None:  # type: ignore[union-attr]
                    continue
                while True:
                    with contextlib.suppress(requests.RequestException):
                        r = s.post(f"{endpoint}/v3/kv/put", json={"key": "aGVhbHRo"}, timeout=2)
                        if r.status_code == 200:
                            break
                    if time.monotonic() > deadline:
                        raise AssertionError(f"etcd member {endpoint} not serving writes")
                    time.sleep(0.1)

    def __enter__(self) -> Cluster:
        self.start()
        self.healthy()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A fresh 3-member cluster for one test (tests/system/: test_fleet.py, test_slots.py)."""
    with Cluster(tmp_path_factory.mktemp("etcd")) as c:
        yield c
