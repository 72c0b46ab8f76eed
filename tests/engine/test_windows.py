"""Maintenance windows in wall-clock time: across midnight, on chosen days, through daylight
saving changes, and the first opening before a NotBefore."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo, available_timezones

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduledeventsd.config import EventRule
from scheduledeventsd.engine.gates.window import hold
from scheduledeventsd.model import Event
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


# ---- daylight saving: the week before each change, in zones with 1-hour and 30-minute changes

NEW_YORK = ZoneInfo("America/New_York")
LORD_HOWE = ZoneInfo("Australia/Lord_Howe")  # +10:30 in winter, +11 in summer
SUNDAY = {6}
# (zone, the Sunday the clocks go forward, the Sunday they go back, the window that the spring
# change skips wholly: local start and end)
CHANGES = [
    (BERLIN, "2026-03-29", "2026-10-25", ("02:00", "03:00")),
    (NEW_YORK, "2026-03-08", "2026-11-01", ("02:00", "03:00")),
    (LORD_HOWE, "2026-10-04", "2026-04-05", ("02:00", "02:30")),
]


def local(text, zone):
    return dt.datetime.fromisoformat(text).replace(tzinfo=zone).timestamp()


def week_before(day, zone):
    """Every half hour of the seven days before `day`'s end, local to `zone`."""
    end = local(f"{day}T23:59", zone)
    return [end - k * 1800 for k in range(7 * 48)]


def test_a_window_the_spring_change_skips_wholly_waits_for_its_next_real_opening():
    """`sun 02:00-03:00 Europe/Berlin` has no length on the spring-forward Sunday: computing
    the next opening raised StopIteration (hold) or returned an opening that is its closing.
    From anywhere in the week before, the next opening is the Sunday after, with its hour."""
    for zone, spring, _, (start, end) in CHANGES:
        w = window(start, end, days=SUNDAY, zone=zone)
        next_sunday = (dt.date.fromisoformat(spring) + dt.timedelta(days=7)).isoformat()
        real = (local(f"{next_sunday}T{start}", zone), local(f"{next_sunday}T{end}", zone))
        for now in week_before(spring, zone):
            assert current_or_next((w,), now) == real, (zone, now)
            assert opening((w,), now, now + 30 * 86400) == real[0], (zone, now)


def test_a_window_starting_in_the_skipped_hour_opens_at_the_first_instant_after_it():
    """02:30-03:30 Berlin on 29 March 2026: 02:30 never shows; the window is 03:00-03:30 CEST.
    Python reads 02:30 as 03:30 CEST, which made the window's opening its closing."""
    w = window("02:30", "03:30", days=SUNDAY, zone=BERLIN)
    assert current_or_next((w,), at("2026-03-28T12:00")) == (
        at("2026-03-29T01:00"),
        at("2026-03-29T01:30"),
    )
    lh = window("02:15", "03:00", days=SUNDAY, zone=LORD_HOWE)  # 02:00-02:30 skipped
    assert current_or_next((lh,), local("2026-10-03T12:00", LORD_HOWE)) == (
        local("2026-10-04T02:30", LORD_HOWE),
        local("2026-10-04T03:00", LORD_HOWE),
    )


# The hour the clocks show twice in autumn, as a window, and how long it then lasts.
REPEATED = {BERLIN: ("02:00", "03:00", 7200), NEW_YORK: ("01:00", "02:00", 7200)}
REPEATED[LORD_HOWE] = ("01:30", "02:00", 3600)  # back from +11 to +10:30


def test_in_the_hour_repeated_in_autumn_a_window_opens_once():
    """The clocks show the repeated hour twice: a window over it opens at its first showing and
    stays open through the second (one span, twice as long), from anywhere in the week before;
    one inside that hour opens at its first showing only."""
    for zone, _, autumn, _ in CHANGES:
        start, end, length = REPEATED[zone]
        w = window(start, end, days=SUNDAY, zone=zone)
        opens = local(f"{autumn}T{start}", zone)
        for now in week_before(autumn, zone):
            if now < opens:
                assert current_or_next((w,), now) == (opens, opens + length), (zone, now)
        for now in [opens + k * 300 for k in range(length // 300)]:
            assert current_or_next((w,), now) == (opens, opens + length), (zone, now)
        after = opens + length
        assert opening((w,), after, after + 6 * 86400) is None, (zone, "opened twice")
    inside = window("02:15", "02:45", days=SUNDAY, zone=BERLIN)
    assert current_or_next((inside,), at("2026-10-24T12:00")) == (
        at("2026-10-25T00:15"),  # 02:15 CEST
        at("2026-10-25T00:45"),
    )
    assert opening((inside,), at("2026-10-25T00:46"), at("2026-10-26T00:00")) is None, (
        "02:15 CET, its second showing, opens nothing"
    )


def test_holding_an_event_for_a_window_the_spring_change_skips_does_not_raise():
    """when.hold looked for the window of an opening that had no length: StopIteration, and
    every DocumentFetched of the week before the change became internal_error."""
    w = window("02:00", "03:00", days=SUNDAY, zone=BERLIN)
    rule = EventRule(("drain",))
    for not_before in (at("2026-03-29T12:00"), at("2026-04-06T12:00")):
        nb = dt.datetime.fromtimestamp(not_before, dt.timezone.utc)
        reboot = Event("E1", "Reboot", "Scheduled", "VirtualMachine", ("vm",), nb)
        for now in week_before("2026-03-29", BERLIN):
            if now < not_before - 600:
                held = hold(reboot, rule, (w,), now)
                if not_before < at("2026-04-05T00:00"):
                    assert held is None, "no window opens before NotBefore: as without one"
                else:
                    assert held is not None
                    assert held.reason == "window"
                    assert held.at == at("2026-04-05T00:00"), "02:00 CEST a week later"


times = st.times().map(lambda t: t.replace(second=0, microsecond=0, tzinfo=None))


def next_change(zone: ZoneInfo, since: float) -> tuple[float, dt.time]:
    """The zone's next change of offset within 400 days of `since` (or `since` itself), and the
    local time the clocks showed as it came: where a window starting then is cut or doubled."""
    offset = dt.datetime.fromtimestamp(since, zone).utcoffset()
    day = since
    for _ in range(400):
        if dt.datetime.fromtimestamp(day + 86400, zone).utcoffset() != offset:
            before, after = int(day), int(day) + 86400
            while after - before > 1:
                middle = (before + after) // 2
                if dt.datetime.fromtimestamp(middle, zone).utcoffset() == offset:
                    before = middle
                else:
                    after = middle
            shown = dt.datetime.fromtimestamp(before, zone) + dt.timedelta(seconds=1)
            return float(after), shown.time().replace(second=0, microsecond=0, tzinfo=None)
        day += 86400
    return since, dt.time(0, 0)


@st.composite
def cases(draw):  # type: ignore[no-untyped-def]
    """A zone, an instant and a window: half the time the instant lies in the week before one of
    the zone's changes and the window starts as the clocks change, on that day."""
    zone = ZoneInfo(
        draw(
            st.sampled_from(sorted(available_timezones()))
            | st.sampled_from(["Europe/Berlin", "America/New_York", "Australia/Lord_Howe"])
        )
    )
    now = draw(st.floats(0, 4.1e9))  # 1970 to 2099
    start = draw(times)
    minutes = draw(st.integers(1, 24 * 60 - 1) | st.sampled_from([15, 30, 60]))
    days = draw(st.sets(st.integers(0, 6), min_size=1) | st.just(frozenset(range(7))))
    if draw(st.booleans()):
        change, start = next_change(zone, now)
        now = change - draw(st.floats(0, 8 * 86400))
        days = {dt.datetime.fromtimestamp(change, zone).weekday()}
    since_midnight = (start.hour * 60 + start.minute + minutes) % (24 * 60)
    end = dt.time(since_midnight // 60, since_midnight % 60)
    return Window(frozenset(days), start, end, zone), now


@settings(max_examples=500, deadline=None)
@given(
    case=cases(),
    ahead=st.floats(0, 8 * 86400),
    start_before=st.none() | st.floats(0, 7 * 86400),
)
def test_the_next_opening_never_raises_is_not_before_now_and_has_a_length(
    case, ahead, start_before
):
    """Over every zone the system knows and any instant: the window open now or next is an
    interval of positive length that has not closed, `opening` is at or after now, and
    deciding when an event's hooks start never raises."""
    w, now = case
    span = current_or_next((w,), now)
    assert span is not None, "a window on some day of the week opens within 400 days"
    assert span[1] > span[0]
    assert span[1] > now
    first = opening((w,), now, now + 400 * 86400)
    assert first is not None
    assert first >= now
    assert first == max(span[0], now)
    not_before = dt.datetime.fromtimestamp(now + ahead, dt.timezone.utc)
    reboot = Event("E1", "Reboot", "Scheduled", "VirtualMachine", ("vm",), not_before)
    held = hold(reboot, EventRule(("drain",), start_before=start_before), (w,), now)
    assert held is None or now < held.at <= not_before.timestamp()
