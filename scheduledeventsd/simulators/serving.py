"""The HTTP server the three simulators share (Azure's, AWS's and Google Cloud's): a thread of
its own, one answer written the same way, and clients that hang up are not errors."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional


class Serving:
    """A simulator's HTTP server on a thread of its own: Azure's, AWS's and Google Cloud's."""

    PATH = ""  # what its URL ends with
    _server: Optional[_Server] = None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        raise NotImplementedError

    def start(self, host: str = "127.0.0.1", port: int = 0) -> tuple[str, int]:
        """Serve in a background thread; returns the bound address (port 0 picks a free one)."""
        self._server = _Server((host, port), self._handler())
        name = type(self).__name__.lower()
        threading.Thread(target=self._server.serve_forever, name=name, daemon=True).start()
        bound = self._server.server_address
        return str(bound[0]), int(bound[1])

    @property
    def url(self) -> str:
        assert self._server is not None, "start() first"  # noqa: S101 - programming error
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}{self.PATH}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def reply(
    handler: BaseHTTPRequestHandler,
    status: int,
    body: object,
    content_type: str = "application/json; charset=utf-8",
    headers: tuple[tuple[str, str], ...] = (),
) -> None:
    """One answer: bytes as they are, text as text, anything else as JSON."""
    if isinstance(body, bytes):
        data = body
    elif isinstance(body, str):
        data = body.encode()
    else:
        data = json.dumps(body, separators=(",", ":")).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    for name, value in headers:
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that hangs up mid-answer (a timed-out poll) is normal here, not an error."""
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)  # type: ignore[arg-type]
