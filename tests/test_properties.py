"""Property tests (hypothesis): untrusted input is typed data or a clear error, never a crash."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduledeventsd import config
from scheduledeventsd.model import Document, DocumentError, parse_document

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=6,
)
field_values = scalars | st.lists(st.text(max_size=12), max_size=3) | json_values
event_like = st.fixed_dictionaries(
    {},
    optional={
        key: field_values
        for key in (
            "EventId",
            "EventType",
            "EventStatus",
            "ResourceType",
            "Resources",
            "NotBefore",
            "Description",
            "EventSource",
            "DurationInSeconds",
        )
    },
)
documents = st.fixed_dictionaries(
    {},
    optional={
        "DocumentIncarnation": json_values,
        "Events": st.lists(event_like, max_size=4) | json_values,
    },
)


def _parses_or_refuses(body: bytes) -> None:
    try:
        doc = parse_document(body)
    except DocumentError:
        return
    assert isinstance(doc, Document)
    assert all(e.event_id and e.event_type and e.status for e in doc.events)


@given(st.binary(max_size=512))
def test_any_bytes_are_a_document_or_a_document_error(body):
    _parses_or_refuses(body)


@settings(max_examples=300)
@given(documents)
def test_any_json_shaped_like_a_document_is_a_document_or_a_document_error(raw):
    _parses_or_refuses(json.dumps(raw).encode())


@given(st.integers(min_value=1, max_value=20_000))
def test_bodies_nested_arbitrarily_deep_are_refused_not_crashed_on(depth):
    _parses_or_refuses(b"[" * depth + b"]" * depth)
    _parses_or_refuses(
        b'{"DocumentIncarnation": 1, "Events": [' + b'{"a":' * depth + b"1" + b"}" * depth + b"]}"
    )


config_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [*config.TOP_KEYS, *config.METADATA_KEYS, *config.RULE_KEYS, "command", "x"]
            )
            | st.text(max_size=10),
            inner,
            max_size=5,
        )
    ),
    max_leaves=25,
)


@settings(max_examples=300)
@given(config_values)
def test_any_yaml_value_is_a_config_or_errors_that_name_the_source(raw):
    problems: list[str] = []
    try:
        parsed = config.parse(raw, "fuzz.yaml", check_files=False)
    except config.ConfigError as e:
        problems = e.problems
    else:
        assert isinstance(parsed, config.Config)
        return
    assert problems
    assert all(p.startswith("fuzz.yaml: ") for p in problems)
