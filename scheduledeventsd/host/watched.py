"""requests within bounds: one deadline for a whole exchange (`deadline.Watch`) and a cap on
what is read of an answer. For the daemon's clients that use requests (webhooks, etcd, `status`);
kept apart from deadline.py so the daemon without them never imports requests.
"""

from __future__ import annotations

from typing import Any, Optional

import requests
import urllib3
from requests.adapters import HTTPAdapter

from .deadline import Watch


class WatchedAdapter(HTTPAdapter):
    """requests' adapter that hands each connection it uses to `self.watch` (the exchange in
    progress, if any), and retries nothing itself: urllib3 reads a retried answer's whole body
    into memory before retrying (`drain_conn`), and sleeps whatever Retry-After says."""

    def __init__(self) -> None:
        super().__init__(max_retries=0)
        self.watch: Optional[Watch] = None

    def get_connection_with_tls_context(self, *args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
        return self._watched(super().get_connection_with_tls_context(*args, **kwargs))

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:  # noqa: ANN401 - requests < 2.32
        return self._watched(super().get_connection(*args, **kwargs))

    def _watched(self, pool: Any) -> Any:  # noqa: ANN401 - urllib3's pool
        """Each connection the pool gives out is told to the watch of the moment."""
        if getattr(pool, "_watched_by", None) is self:
            return pool
        get_conn = pool._get_conn

        def watched_get_conn(*args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
            connection = get_conn(*args, **kwargs)
            watch = self.watch
            if watch is not None:
                watch.watch(connection)
            return connection

        pool._get_conn = watched_get_conn
        pool._watched_by = self
        return pool


def read_at_most(response: requests.Response, limit: int) -> Optional[bytes]:
    """At most `limit` bytes of a streamed response's body, as sent (never decompressed: a
    small gzip can be a huge body); None, and the connection closed, when there is more. A body
    read to its end gives its connection back to the pool (etcd's calls reuse it)."""
    try:
        data = response.raw.read(limit + 1, decode_content=False)
    except urllib3.exceptions.HTTPError as e:  # a broken body is a requests error, as elsewhere
        raise requests.ConnectionError(str(e)) from None
    if len(data) > limit:
        response.close()
        return None
    response.raw.release_conn()  # a short read is the body's end: the connection is clean
    return bytes(data)
