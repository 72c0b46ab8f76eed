"""`test-hooks`: run the configured hooks of one stage for a synthetic event, as a real one would.

Operators rehearse their drain without waiting for Azure: the same environment and stdin a real
event gets (EventId `test-...`, naming this VM), no IMDS call, no state, no approval.
"""

from __future__ import annotations

import datetime as dt
import socket
import uuid
from typing import Callable

from ..config import Config
from ..host.hooks import CommandResult, ProcessRunner, run_hooks
from ..model import SCHEDULED, STARTED, Event

Printer = Callable[[str], None]


def synthetic_event(event_type: str, vm_name: str, stage: str, now: dt.datetime) -> Event:
    return Event(
        event_id=f"test-{uuid.uuid4()}",
        event_type=event_type,
        status=SCHEDULED if stage != "after" else STARTED,
        resource_type="VirtualMachine",
        resources=(vm_name,),
        not_before=now.replace(microsecond=0) + dt.timedelta(minutes=15)
        if stage != "after"
        else None,
        description="scheduledeventsd test-hooks: a rehearsal, not a real event",
        source="User",
        duration_seconds=-1,
    )


def rehearse(config: Config, event_type: str, stage: str, say: Printer) -> int:
    """Exit status: 0 if every hook succeeded, 1 if one failed, 2 if there is nothing to run."""
    rule = config.events.get(event_type)
    hooks = () if rule is None else rule.hooks_for(stage)
    if rule is None or not hooks:
        say(f"test-hooks: no {stage} hooks are configured for {event_type}")
        return 2
    vm_name = config.vm_name or socket.gethostname()
    event = synthetic_event(event_type, vm_name, stage, dt.datetime.now(dt.timezone.utc))
    say(f"test-hooks: {event_type} {stage}: event {event.event_id} for {vm_name}")

    def finished(hook: str, result: CommandResult) -> None:
        status = "timed out" if result.timed_out else f"exit {result.exit_status}"
        if result.error:
            status += f" ({result.error})"
        say(f"[{hook}] {status} in {result.duration_s:.2f}s")

    failure = run_hooks(
        ProcessRunner(),
        stage=stage,
        hooks=tuple(config.hooks[name] for name in hooks),
        event=event,
        incarnation=0,
        vm_name=vm_name,
        extra_env=config.environment,
        on_started=lambda hook, argv: say(f"[{hook}] running {' '.join(argv)}"),
        on_finished=finished,
        on_output=lambda hook, stream, line: say(f"[{hook}] {stream}: {line}"),
    )
    if failure is None:
        say(f"test-hooks: {event_type} {stage}: {len(hooks)} hook(s) succeeded")
        return 0
    say(f"test-hooks: {event_type} {stage}: FAILED at {' '.join(failure.argv)}")
    return 1
