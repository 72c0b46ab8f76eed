"""Maintenance windows in wall-clock time: across midnight, on chosen days, through daylight
saving changes, and the first opening before a NotBefore."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

from scheduledeventsd.windows import Window, current_or_next, opening

BERLIN = ZoneInfo("Europe/Berlin")
UTC = ZoneInfo("UTC")
EVERY_DAY = frozenset(range(7))


def at(text, zone=UTC):
    return dt.datetime.fromisoformat(text).replace(tzinfo=zone).timestamp()


def window(start, end, days=EVERY_DAY, zone=UTC):
    return Window(frozenset(days), dt.time.fromisoformat(start), dt.time.fromisoformat(end), zone)


def test_inside_a_window_the_opening_is_now():
    w = window("02:00", "05:00")
    now = at("2026-11-26T03:00")
    assert opening((w,), now, now + 86400) == now


def test_before_a_window_the_opening_is_its_start_and_none_when_it_opens_after_not_before():
    w = window("02:00", "05:00")
    now = at("2026-11-26T12:00")
    assert opening((w,), now, now + 86400) == at("2026-11-27T02:00")
    assert opening((w,), now, at("2026-11-27T02:00")) is None, "opening at NotBefore is too late"


def test_a_window_past_midnight_is_open_after_midnight_and_closes_the_next_day():
    w = window("23:00", "01:00", days={3})  # opens Thursdays
    thursday_late = at("2026-11-26T23:30")  # a Thursday
    friday_early = at("2026-11-27T00:30")
    friday_late = at("2026-11-27T01:30")
    assert opening((w,), thursday_late, thursday_late + 10) == thursday_late
    assert opening((w,), friday_early, friday_early + 10) == friday_early, "still Thursday's"
    assert opening((w,), friday_late, friday_late + 8 * 86400) == at("2026-12-03T23:00")


def test_only_the_days_named_open():
    w = window("02:00", "05:00", days={5, 6})  # sat, sun
    thursday = at("2026-11-26T12:00")
    assert opening((w,), thursday, thursday + 7 * 86400) == at("2026-11-28T02:00")


def test_local_time_follows_daylight_saving_in_both_directions():
    w = window("02:00", "05:00", zone=BERLIN)
    winter = at("2026-03-27T12:00")  # before the clocks go forward on Sunday 29 March
    assert opening((w,), winter, winter + 86400) == at("2026-03-28T01:00")  # 02:00 CET
    # 29 March: 02:00 local does not exist; the window opens with the first instant after the
    # gap (03:00 CEST = 01:00 UTC) and closes at 05:00 CEST = 03:00 UTC.
    sunday = at("2026-03-28T12:00")
    assert opening((w,), sunday, sunday + 86400) == at("2026-03-29T01:00")
    assert opening((w,), at("2026-03-29T02:59"), at("2026-03-30T00:00")) == at("2026-03-29T02:59")
    assert opening((w,), at("2026-03-29T03:01"), at("2026-03-30T00:00")) is None
    summer = at("2026-06-01T12:00")
    assert opening((w,), summer, summer + 86400) == at("2026-06-02T00:00")  # 02:00 CEST
    autumn = at("2026-10-24T12:00")  # back to CET on Sunday 25 October
    assert opening((w,), autumn, autumn + 86400) == at("2026-10-25T00:00")  # 02:00 CEST


def test_of_several_windows_the_earliest_opening_counts():
    early = window("02:00", "03:00", days={5})
    later = window("20:00", "21:00", days={3})
    now = at("2026-11-26T12:00")  # Thursday
    assert opening((early, later), now, now + 7 * 86400) == at("2026-11-26T20:00")
    assert current_or_next((early, later), now) == (at("2026-11-26T20:00"), at("2026-11-26T21:00"))
    assert current_or_next((), now) is None


def test_a_window_describes_itself_as_configured():
    assert window("23:00", "01:00", days={5, 6}, zone=BERLIN).describe() == (
        "sat,sun 23:00-01:00 Europe/Berlin"
    )
