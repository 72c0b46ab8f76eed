"""One retry policy for everything that retries: polls, approvals and the VM-name lookup.

Pure and clock-free like the engine (cf. cloud-init's `ReadUrlRetryHandler`): a `Backoff` says
how long to wait after the n-th failure in a row, and a `Failures` record says when to try again
and whether this failure is worth a log line (the first, a change of kind, or a reminder), so a
persisting fault is logged a few times an hour, never each second.
"""

from __future__ import annotations

from dataclasses import dataclass

REMINDER = 300.0  # a persisting failure is logged again this often (seconds)


@dataclass(frozen=True)
class Backoff:
    """`first` after one failure, doubling up to `cap`."""

    first: float
    cap: float

    def delay(self, failures: int) -> float:
        if failures <= 0:
            return 0.0
        return min(self.first * 2.0 ** min(failures - 1, 30), max(self.cap, self.first))


@dataclass(frozen=True)
class Failures:
    """A run of consecutive failures of one operation; `count == 0` means it last succeeded."""

    count: int = 0
    kind: str = ""
    since: float = 0.0
    logged_at: float = 0.0
    retry_at: float = 0.0

    def failed(
        self,
        kind: str,
        now: float,
        backoff: Backoff,
        *,
        at_least: float = 0.0,
    ) -> tuple[Failures, bool]:
        """The record after one more failure, and whether to log it.

        `at_least` lets the server ask for a longer wait (429 Retry-After), never longer than the
        cap: a 30 s Preempt must not be missed because a server said "come back in an hour".
        """
        count = self.count + 1
        delay = backoff.delay(count)
        if at_least > delay:
            delay = min(at_least, max(backoff.cap, backoff.first))
        log = count == 1 or kind != self.kind or now - self.logged_at >= REMINDER
        return (
            Failures(
                count=count,
                kind=kind,
                since=self.since if self.count else now,
                logged_at=now if log else self.logged_at,
                retry_at=now + delay,
            ),
            log,
        )
