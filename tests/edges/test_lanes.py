"""The poll lane carries out the engine's orders at their instants, against the simulator."""

from __future__ import annotations

import queue
import time

from scheduledeventsd.engine import DocumentFetched
from scheduledeventsd.providers.imds import ImdsClient
from scheduledeventsd.runtime.lanes import PollLane, fetch, poll_error


def client(sim):
    return ImdsClient(sim.url, "2020-07-01", 2.0, 2.0)


def gets(sim):
    return [r.at for r in sim.requests if r.method == "GET"]


def test_an_order_is_carried_out_at_its_instant_and_its_answer_comes_back(sim):
    inbox = queue.SimpleQueue()
    lane = PollLane("test-poll", inbox, client(sim))
    at = time.monotonic() + 0.3
    lane.order(at, fetch, poll_error)
    message = inbox.get(timeout=5)
    assert isinstance(message, DocumentFetched)
    assert time.monotonic() >= at
    assert len(gets(sim)) == 1
    lane.stop()


def test_a_new_order_replaces_one_whose_instant_has_not_come(sim):
    inbox = queue.SimpleQueue()
    lane = PollLane("test-poll", inbox, client(sim))
    lane.order(time.monotonic() + 30, fetch, poll_error)
    lane.order(time.monotonic() + 0.1, fetch, poll_error)
    assert isinstance(inbox.get(timeout=5), DocumentFetched)
    time.sleep(0.3)
    assert inbox.empty()
    assert len(gets(sim)) == 1, "the order for later was replaced, not kept"
    lane.stop()


def test_polls_at_a_steady_interval_each_come_at_their_instant(sim):
    """After two orders the lane sleeps until the instant their gap predicts instead of being
    woken for each order; an order later than that is still kept to its instant."""
    inbox = queue.SimpleQueue()
    lane = PollLane("test-poll", inbox, client(sim))
    start = time.monotonic() + 0.1
    instants = [start + 0.1 * k for k in range(5)] + [start + 0.9]  # the last one, late
    carried = []
    for at in instants:
        lane.order(at, fetch, poll_error)
        assert isinstance(inbox.get(timeout=5), DocumentFetched)
        carried.append(time.monotonic())
    for at, done in zip(instants, carried):
        assert at <= done < at + 0.1
    lane.stop()


def test_stop_wakes_a_lane_waiting_for_a_far_order(sim):
    lane = PollLane("test-poll", queue.SimpleQueue(), client(sim))
    lane.order(time.monotonic() + 3600, fetch, poll_error)
    time.sleep(0.05)
    lane.stop()
    lane._thread.join(2)
    assert not lane._thread.is_alive()
    assert gets(sim) == []


def test_a_new_connection_serves_the_next_poll_and_the_old_one_is_closed(sim):
    inbox = queue.SimpleQueue()
    first, second = client(sim), client(sim)
    lane = PollLane("test-poll", inbox, first)
    lane.order(time.monotonic(), fetch, poll_error)
    inbox.get(timeout=5)
    assert first._link is not None
    lane.use(second)
    lane.order(time.monotonic(), fetch, poll_error)
    inbox.get(timeout=5)
    assert first._link is None, "closed by the lane before its next poll"
    assert second._link is not None
    lane.stop()


def test_a_cancelled_order_is_not_carried_out(sim):
    inbox = queue.SimpleQueue()
    lane = PollLane("test-poll", inbox, client(sim))
    lane.order(time.monotonic() + 0.2, fetch, poll_error)
    lane.cancel()
    time.sleep(0.4)
    assert inbox.empty()
    assert gets(sim) == []
    lane.stop()
