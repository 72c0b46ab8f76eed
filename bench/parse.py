"""Cost of one churn document (50 events, one new each time) through parsing and the engine.

    python -m bench.parse

Side by side in one run: parsing every event again, and with the cache of parsed events that
the IMDS client keeps; prints milliseconds per document and the ratio.
"""

from __future__ import annotations

import email.utils
import json
import time
import uuid
from pathlib import Path
from typing import Optional

from scheduledeventsd import engine
from scheduledeventsd.config import Config
from scheduledeventsd.engine import Boot, DocumentFetched, Tick
from scheduledeventsd.model import EventCache, parse_document

DOCUMENTS = 400
EVENTS = 50


def documents() -> list[bytes]:
    not_before = email.utils.formatdate(time.time() + 900, usegmt=True)
    events = [
        {
            "EventId": str(uuid.uuid4()).upper(),
            "EventStatus": "Scheduled",
            "EventType": "Reboot",
            "ResourceType": "VirtualMachine",
            "Resources": [f"other-vm-{i}"],
            "NotBefore": not_before,
            "Description": "Host server is undergoing maintenance.",
            "EventSource": "Platform",
            "DurationInSeconds": -1,
        }
        for i in range(EVENTS)
    ]
    bodies = []
    for n in range(DOCUMENTS):
        events[n % EVENTS] = dict(events[n % EVENTS], EventId=str(uuid.uuid4()).upper())
        bodies.append(json.dumps({"DocumentIncarnation": n + 2, "Events": events}).encode())
    return bodies


def per_document_ms(bodies: list[bytes], cache: Optional[EventCache]) -> float:
    cfg = Config(vm_name="this-vm", hooks={}, events={"Reboot": ()}, state_dir=Path("/unused"))
    state, _ = engine.step(engine.initial(cfg), Boot({}), 0.0)
    started = time.perf_counter()
    for n, body in enumerate(bodies):
        state, _ = engine.step(state, Tick(), float(n))
        state, _ = engine.step(state, DocumentFetched(parse_document(body, cache)), n + 0.01)
    return (time.perf_counter() - started) / len(bodies) * 1000


def main() -> None:
    bodies = documents()
    without = min(per_document_ms(bodies, None) for _ in range(3))
    cached = min(per_document_ms(bodies, EventCache()) for _ in range(3))
    print(f"no cache    {without:.3f} ms per document")
    print(f"with cache  {cached:.3f} ms per document  ({without / cached:.2f}x faster)")


if __name__ == "__main__":
    main()
