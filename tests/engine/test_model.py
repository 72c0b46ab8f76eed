"""Parsing the document as IMDS and re-serialising tools really send it."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from scheduledeventsd.model import DocumentError, EventCache, parse_document, parse_not_before

UTC = dt.timezone.utc

REAL = (
    b'{"DocumentIncarnation":5,"Events":[{"EventId":"C7061BAC-AFDC-4513-B24B-AA5F13A16123",'
    b'"EventStatus":"Scheduled","EventType":"Freeze","ResourceType":"VirtualMachine",'
    b'"Resources":["WestNO_0","WestNO_1"],"NotBefore":"Mon, 11 Apr 2022 22:26:58 GMT",'
    b'"Description":"Virtual machine is being paused because of a memory-preserving Live Migration '
    b'operation.","EventSource":"Platform","DurationInSeconds":5}]}'
)


def test_a_real_compact_document_parses_into_typed_fields():
    doc = parse_document(REAL)
    assert doc.incarnation == 5
    (event,) = doc.events
    assert event.event_id == "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
    assert event.event_type == "Freeze"
    assert event.resources == ("WestNO_0", "WestNO_1")
    assert event.not_before == dt.datetime(2022, 4, 11, 22, 26, 58, tzinfo=UTC)
    assert event.duration_seconds == 5
    assert event.source == "Platform"
    assert doc.skipped == ()


def test_key_order_and_key_case_do_not_matter():
    raw = json.loads(REAL)
    event = raw["Events"][0]
    shuffled = {k.lower(): event[k] for k in reversed(list(event))}
    doc = parse_document(json.dumps({"events": [shuffled], "documentincarnation": 5}).encode())
    assert doc.events[0].event_type == "Freeze"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Mon, 19 Sep 2016 18:29:47 GMT", dt.datetime(2016, 9, 19, 18, 29, 47, tzinfo=UTC)),
        # The docs' own example has the wrong weekday (19 Sep 2016 was a Monday, not Friday).
        ("Fri, 19 Sep 2016 18:29:47 GMT", dt.datetime(2016, 9, 19, 18, 29, 47, tzinfo=UTC)),
        ("2025-06-06T12:00:00Z", dt.datetime(2025, 6, 6, 12, 0, 0, tzinfo=UTC)),
        ("2025-06-06T14:00:00+02:00", dt.datetime(2025, 6, 6, 12, 0, 0, tzinfo=UTC)),
        ("2025-06-06T12:00:00", dt.datetime(2025, 6, 6, 12, 0, 0, tzinfo=UTC)),
        ("", None),
        ("   ", None),
    ],
)
def test_not_before_accepts_rfc1123_iso8601_and_empty(text, expected):
    assert parse_not_before(text) == expected


def test_unparseable_not_before_is_an_error_naming_the_value():
    with pytest.raises(ValueError, match="tomorrow-ish"):
        parse_not_before("tomorrow-ish")


def test_old_api_versions_without_newer_fields_still_parse():
    doc = parse_document(
        b'{"DocumentIncarnation":1,"Events":[{"EventId":"A","EventStatus":"Scheduled",'
        b'"EventType":"Reboot","ResourceType":"VirtualMachine","Resources":["vm1"],"NotBefore":""}]}'
    )
    event = doc.events[0]
    assert (event.description, event.source, event.duration_seconds) == ("", "", None)
    assert event.not_before is None


def test_a_bad_event_is_skipped_with_its_reason_and_the_rest_kept():
    doc = parse_document(
        json.dumps(
            {
                "DocumentIncarnation": 3,
                "Events": [
                    {"EventId": "", "EventType": "Reboot", "EventStatus": "Scheduled"},
                    {
                        "EventId": "B",
                        "EventType": "Reboot",
                        "EventStatus": "Scheduled",
                        "Resources": "vm1",
                    },
                    {
                        "EventId": "C",
                        "EventType": "Reboot",
                        "EventStatus": "Scheduled",
                        "NotBefore": "soon",
                    },
                    "not an object",
                    {
                        "EventId": "D",
                        "EventType": "Reboot",
                        "EventStatus": "Scheduled",
                        "Resources": ["vm1"],
                    },
                    {
                        "EventId": "D",
                        "EventType": "Freeze",
                        "EventStatus": "Scheduled",
                        "Resources": ["vm1"],
                    },
                ],
            }
        ).encode()
    )
    assert [e.event_id for e in doc.events] == ["D"]
    assert len(doc.skipped) == 4
    assert doc.skipped[0].startswith("Events[0]: EventId is empty")
    assert "Resources" in doc.skipped[1]
    assert "NotBefore" in doc.skipped[2]
    # A second D unlike the first: kept for the engine to choose (engine/copies).
    (copy,) = doc.copies
    assert (copy.index, copy.first, copy.event.event_type) == (5, 4, "Freeze")


@pytest.mark.parametrize(
    "body",
    [
        b"<html>",
        b"[]",
        b'{"Events":[]}',
        b'{"DocumentIncarnation":true,"Events":[]}',
        b'{"DocumentIncarnation":1,"Events":{}}',
        b"\xff\xfe",
    ],
)
def test_a_response_that_is_no_document_raises_document_error(body):
    with pytest.raises(DocumentError):
        parse_document(body)


def test_empty_events_and_string_incarnation_are_accepted():
    assert parse_document(b'{"DocumentIncarnation":"7","Events":null}').incarnation == 7


def test_nul_in_event_text_is_replaced_so_it_can_travel_in_the_environment():
    doc = parse_document(
        b'{"DocumentIncarnation":1,"Events":[{"EventId":"A","EventStatus":"Scheduled",'
        b'"EventType":"Reboot","Resources":["vm1"],"Description":"a\\u0000b"}]}'
    )
    assert "\x00" not in doc.events[0].description


def test_to_json_round_trips_through_the_parser():
    event = parse_document(REAL).events[0]
    again = parse_document(
        json.dumps({"DocumentIncarnation": 1, "Events": [event.to_json()]}).encode()
    )
    assert again.events[0] == event


def test_an_incarnation_of_unicode_digits_is_a_document_error_not_a_crash():
    """'²'.isdigit() is true but int('²') raises: found by the property test."""
    with pytest.raises(DocumentError):
        parse_document(json.dumps({"DocumentIncarnation": "²", "Events": []}).encode())


def test_the_event_cache_keeps_only_the_last_two_documents_events():
    """Under churn new events come every second: the cache must not grow with them."""
    cache = EventCache()
    for i in range(5000):
        body = {"DocumentIncarnation": i, "Events": [
            {"EventId": f"E{i}", "EventType": "Freeze", "EventStatus": "Scheduled",
             "Resources": ["vm"], "NotBefore": ""},
            {"EventId": "steady", "EventType": "Reboot", "EventStatus": "Scheduled",
             "Resources": ["vm"], "NotBefore": ""},
        ]}  # fmt: skip
        doc = parse_document(json.dumps(body).encode(), cache)
        assert [e.event_id for e in doc.events] == [f"E{i}", "steady"]
    assert len(cache) <= 4
