"""Poll timing: when the next GET goes out, after an answer or a failure."""

from __future__ import annotations

from typing import Optional

from ...config import Config
from ...records import Level, Record, What
from ...retry import Backoff
from ..frozen import replace
from ..state import Poll, State
from ..vocabulary.constants import POLL_BACKOFF_CAP, STALL_MARGIN, TAKE_BACK
from ..vocabulary.effects import CancelFetch, Effect, Fetch
from ..vocabulary.messages import PollFailed
from . import rate, turns


def _poll_failed(state: State, msg: PollFailed, now: float, out: list[Effect]) -> State:
    poll = state.poll
    md = state.config.metadata
    backoff = Backoff(md.poll_interval, max(POLL_BACKOFF_CAP, md.poll_interval))
    rejected = msg.status == 400
    failures, log = poll.failures.failed(
        msg.kind,
        now,
        backoff,
        at_least=backoff.cap if rejected else (msg.retry_after or 0.0),
    )
    if log and rejected:
        out.append(
            Record(
                Level.ERROR,
                What.IMDS_REJECTED_REQUEST,
                {
                    "kind": msg.kind,
                    "error": msg.detail,
                    "api_version": md.api_version,
                    "url": md.url,
                    "retry_in_s": round(failures.retry_at - now, 2),
                    "reason": "IMDS says our request is wrong (check metadata.url and "
                    "metadata.api_version), then reload",
                },
            )
        )
    elif log:
        out.append(
            Record(
                Level.WARNING,
                What.POLL_FAILED,
                {
                    "kind": msg.kind,
                    "error": msg.detail,
                    "failures": failures.count,
                    "retry_in_s": round(failures.retry_at - now, 2),
                },
            )
        )
    return replace(
        state,
        poll=Poll(
            next_at=failures.retry_at,
            failures=failures,
            rejected=msg.detail if rejected else "",
            last=f"{msg.kind} ({failures.count} failures)",
        ),
    )


def _answered(poll: Poll, config: Config, now: float) -> Poll:
    return Poll(next_at=_next_tick(poll, config, now), last="ok")


def _next_tick(poll: Poll, config: Config, now: float) -> float:
    """After an answer: the next poll is due one interval after the last one's start (on the
    monotonic clock: a late poll skips ticks instead of drifting)."""
    interval = config.metadata.poll_interval
    base = poll.scheduled_at
    return base + interval * (max(0, int((now - base) // interval)) + 1)


def _order_next_poll(state: State, now: float, out: list[Effect]) -> State:
    """`_answered` and `_order_poll` for the quick path, building one Poll and one State: at
    rest that is the whole of a step."""
    next_at = _next_tick(state.poll, state.config, now)
    at = _poll_instant(state, next_at, now, out)
    poll = Poll(next_at=next_at, in_flight_since=at, scheduled_at=at, last="ok")
    return replace(state, poll=poll, sent=rate._spent(state.sent, now, at))


def _order_poll(state: State, poll: Poll, now: float, out: list[Effect]) -> State:
    """The first poll, the next after a failure, or one moved behind an approval."""
    at = _poll_instant(state, poll.next_at, now, out)
    poll = replace(poll, in_flight_since=at, scheduled_at=at)
    return replace(state, poll=poll, sent=rate._spent(state.sent, now, at))


def _poll_instant(state: State, next_at: float, now: float, out: list[Effect]) -> float:
    """The poll is ordered for its instant or when the rate limit allows, whichever is later."""
    at = max(now, next_at)
    at = max(at, rate._allowed_at(state, at))
    out.append(Fetch(at))
    return at


def _poll_now(state: State, now: float, out: list[Effect]) -> State:
    """Poll at once: a poll ordered for later is taken back (the lane replaces it), one under
    way is left to end."""
    if _pending_poll(state, now) is not None:
        state = _take_back(state, out)
    return replace(state, poll=replace(state.poll, next_at=now, rejected=""))


def _pending_poll(state: State, now: float) -> Optional[float]:
    """The instant of a poll ordered for later, if it can still be taken back (one due within
    TAKE_BACK may be under way already)."""
    ordered = state.poll.in_flight_since
    return ordered if ordered is not None and ordered > now + TAKE_BACK else None


def _take_back(state: State, out: list[Effect]) -> State:
    """The ordered poll is cancelled and no longer counts against the rate limit."""
    ordered = state.poll.in_flight_since
    out.append(CancelFetch())
    sent = tuple(t for t in state.sent if t != ordered)
    return replace(state, sent=sent, poll=replace(state.poll, in_flight_since=None))


def _make_room(state: State, now: float, out: list[Effect]) -> State:
    """An approval or a name lookup that is due goes first: a poll ordered for later is taken
    back, and none is ordered until it has gone (`_timers`). At 4 Hz the polls alone fill IMDS'
    5 requests a second; an approval that waited for room among them queued behind them
    (measured: 10 s at p50 with an event a second). Polls then start from where the limit put
    them, so each approval costs the polls one slot, not a tick of delay for ever after."""
    if _pending_poll(state, now) is None or not turns._others_due(state, now):
        return state
    return _take_back(state, out)


def _allowed_first(state: State, now: float) -> float:
    """When a request that goes before an ordered poll (`_make_room`) fits in the rate limit."""
    ordered = _pending_poll(state, now)
    if ordered is None:
        return rate._allowed_at(state, now)
    return rate._allowed_at(state, now, tuple(t for t in state.sent if t != ordered))


# ---- the poll's timers: the next GET, and when one in flight counts as stalled


def due(state: State, now: float, allowed: float) -> tuple[float, ...]:
    """The next poll, when the rate limit allows it; while one is in flight and systemd
    watches, the instant it counts as stalled (the watchdog stops). None while stopping."""
    poll = state.poll
    if state.stopping is not None:
        return ()
    if poll.in_flight_since is None:
        return (max(poll.next_at, allowed),) if state.ready else ()
    if state.watchdog_every is None:
        return ()
    md = state.config.metadata
    return (poll.in_flight_since + md.first_call_timeout + md.timeout + STALL_MARGIN,)


def fire(state: State, now: float, out: list[Effect]) -> State:
    """Ordered last, once whatever goes before it (an approval, a name lookup) has gone."""
    if state.ready and state.poll.in_flight_since is None and not turns._others_due(state, now):
        state = _order_poll(state, state.poll, now, out)
    return state
