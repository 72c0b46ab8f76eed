"""A TCP proxy of the tests' own, to cut one client off from a server without touching it.

Put between one daemon and the etcd cluster (one proxy per member, listening on an address of
its own on loopback, 127.0.0.x), it partitions that daemon alone: `cut()` stops forwarding
(the daemon's requests hang as on a network that drops packets: etcd sees no keep-alive and
the lease expires after its TTL), `cut(reset=True)` resets every connection and every new one
(as a firewall's REJECT does), `restore()` forwards again (bytes held during a `cut()` are
then delivered, as TCP's retransmission would). The cluster and the other daemons never notice.

    with ProxySet(cluster.endpoints, host="127.0.0.2") as path:
        settings = {"etcd": {"endpoints": path.endpoints, ...}}
        ...
        path.cut()      # vm-1 is partitioned from every member
        path.restore()

Threads and blocking sockets only (no event loop to share with the test): a connection costs
two threads, which is nothing at a test's scale.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import urllib.parse
from collections.abc import Sequence
from typing import Optional

_CHUNK = 65536


class TcpProxy:
    """Forwards every connection to `host:port` (port 0: one the kernel picks) to `target`."""

    def __init__(self, target: tuple[str, int], host: str = "127.0.0.2", port: int = 0) -> None:
        self.target = target
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, port))
        self._listener.listen(64)
        self.host, self.port = self._listener.getsockname()[:2]
        self._flowing = threading.Event()
        self._flowing.set()
        self._reset = False
        self._stopped = False
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self.accepted = 0  # connections accepted so far (a test can check the path was used)
        self._accept = threading.Thread(target=self._accept_loop, name="proxy-accept", daemon=True)
        self._accept.start()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def cut(self, *, reset: bool = False) -> None:
        """Stop forwarding. Connections are held silent (bytes sent are neither delivered nor
        answered), or, with `reset`, reset now and at once when made."""
        with self._lock:
            self._flowing.clear()
            self._reset = reset
            doomed = list(self._sockets) if reset else []
            if reset:
                self._sockets.clear()
        for sock in doomed:
            _abort(sock)

    def restore(self) -> None:
        """Forward again: held connections go on where they stopped; new ones are forwarded."""
        with self._lock:
            self._reset = False
            self._flowing.set()

    @property
    def is_cut(self) -> bool:
        return not self._flowing.is_set()

    def stop(self) -> None:
        """Close the listener and every connection; joins the threads (bounded)."""
        with self._lock:
            self._stopped = True
            self._flowing.set()  # held pumps wake, see `_stopped`, and end
            sockets = list(self._sockets)
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for sock in sockets:
            _abort(sock)
        self._accept.join(5)
        for thread in list(self._threads):
            thread.join(5)

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # ---- the threads ----------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # stopped
            with self._lock:
                if self._stopped:
                    client.close()
                    return
                self.accepted += 1
                if self._reset:
                    _abort(client)
                    continue
                self._sockets.add(client)
            self._spawn(self._connect, client)

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name="proxy-pump", daemon=True)  # type: ignore[arg-type]
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _connect(self, client: socket.socket) -> None:
        """Dial the target once forwarding is on (a connection made during a cut waits)."""
        if not self._wait_flowing(client):
            return
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            self._forget(client)
            _abort(client)
            return
        upstream.settimeout(None)
        with self._lock:
            if self._stopped or self._reset:
                _abort(upstream)
                self._sockets.discard(client)
                _abort(client)
                return
            self._sockets.add(upstream)
        pair = _Pair(client, upstream)
        self._spawn(self._pump, pair, upstream, client)
        self._pump(pair, client, upstream)

    def _pump(self, pair: _Pair, src: socket.socket, dst: socket.socket) -> None:
        """Copy src to dst; a chunk read during a cut is held until forwarding resumes. The
        second pump of a connection to end closes both sockets."""
        try:
            while True:
                data = src.recv(_CHUNK)
                if not self._wait_flowing(src):
                    break
                if not data:
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
                    break
                dst.sendall(data)
        except OSError:
            pair.broken = True
        if pair.done() or pair.broken:
            self._forget(src)
            self._forget(dst)
            _abort(src)
            _abort(dst)

    def _wait_flowing(self, sock: socket.socket) -> bool:
        """Block while cut; False when the connection was reset or the proxy stopped."""
        self._flowing.wait()
        with self._lock:
            return sock in self._sockets and not self._stopped

    def _forget(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.discard(sock)


class _Pair:
    """The two sockets of one proxied connection, closed once both directions ended."""

    def __init__(self, *sockets: socket.socket) -> None:
        self.sockets = sockets
        self.broken = False
        self._ended = 0
        self._lock = threading.Lock()

    def done(self) -> bool:
        with self._lock:
            self._ended += 1
            return self._ended == 2


class ProxySet:
    """One TcpProxy per URL of `endpoints` (http://host:port), all on `host`: `endpoints` are
    the URLs to give the client; cut and restore act on all of them at once."""

    def __init__(self, endpoints: Sequence[str], host: str = "127.0.0.2") -> None:
        self.proxies: list[TcpProxy] = []
        urls = []
        for endpoint in endpoints:
            parsed = urllib.parse.urlsplit(endpoint)
            assert parsed.hostname is not None, endpoint
            assert parsed.port is not None, endpoint
            proxy = TcpProxy((parsed.hostname, parsed.port), host)
            self.proxies.append(proxy)
            urls.append(f"{parsed.scheme}://{proxy.address}")
        self.endpoints = urls

    def cut(self, *, reset: bool = False, only: Optional[int] = None) -> None:
        """Partition (every member, or the one at index `only`)."""
        for i, proxy in enumerate(self.proxies):
            if only is None or i == only:
                proxy.cut(reset=reset)

    def restore(self) -> None:
        for proxy in self.proxies:
            proxy.restore()

    @property
    def accepted(self) -> int:
        return sum(p.accepted for p in self.proxies)

    def stop(self) -> None:
        for proxy in self.proxies:
            proxy.stop()

    def __enter__(self) -> ProxySet:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def _abort(sock: socket.socket) -> None:
    """Reset the connection (RST, not FIN) and wake a thread blocked reading it."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    with contextlib.suppress(OSError):
        sock.close()
