"""The process runner with real processes: no shell, own process group, timeout, output lines."""

from __future__ import annotations

import datetime as dt
import os
import signal
import threading
import time
from pathlib import Path

from scheduledeventsd.hooks import BASE_ENV, ProcessRunner, hook_environment, hook_stdin
from scheduledeventsd.model import Event

EVENT = Event(
    "E1",
    "Reboot",
    "Scheduled",
    "VirtualMachine",
    ("vm", "vm2"),
    dt.datetime(2030, 1, 1, 12, tzinfo=dt.timezone.utc),
    "d",
    "Platform",
    None,
)


def run(argv, timeout=10.0, stdin=b"", env=None):
    lines = []
    result = ProcessRunner().run(
        tuple(argv),
        env or BASE_ENV,
        stdin,
        timeout,
        lambda stream, line: lines.append((stream, line)),
    )
    return result, lines


def test_exit_status_and_output_lines_are_reported():
    result, lines = run(["/bin/sh", "-c", "echo out; echo err >&2; exit 4"])
    assert result.exit_status == 4
    assert not result.succeeded
    assert sorted(lines) == [("stderr", "err"), ("stdout", "out")]


def test_stdin_is_delivered_and_a_hook_that_ignores_it_does_not_block():
    result, lines = run(["/bin/cat"], stdin=b"hello\n")
    assert lines == [("stdout", "hello")]
    big = b"x" * (1 << 20)
    started = time.monotonic()
    result, _ = run(["/bin/true"], stdin=big)
    assert result.succeeded
    assert time.monotonic() - started < 5


def test_arguments_are_never_interpreted_by_a_shell(tmp_path):
    marker = tmp_path / "m"
    _result, lines = run(["/bin/echo", f"$(touch {marker})", ";", "|"])
    assert lines == [("stdout", f"$(touch {marker}) ; |")]
    assert not marker.exists()


def test_a_missing_executable_is_a_failure_with_a_reason():
    result, _ = run(["/nonexistent/hook"])
    assert result.exit_status is None
    assert "No such file" in result.error


def test_timeout_kills_the_process_group_including_children_that_ignore_sigterm(tmp_path):
    pidfile = tmp_path / "pid"
    script = (
        f"sh -c 'trap \"\" TERM; echo $$ > {pidfile}; while :; do sleep 0.1; done' &\nsleep 300"
    )
    started = time.monotonic()
    result, _ = run(["/bin/sh", "-c", script], timeout=0.5)
    assert result.timed_out
    assert result.exit_status is None
    assert time.monotonic() - started < 10
    pid = int(pidfile.read_text())
    time.sleep(0.2)
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        assert state == "Z", "the TERM-ignoring grandchild must be SIGKILLed"
    except ProcessLookupError:
        pass


def test_cancel_all_stops_running_commands_and_refuses_new_ones():
    runner = ProcessRunner()
    results = []
    thread = threading.Thread(
        target=lambda: results.append(
            runner.run(("/bin/sleep", "300"), BASE_ENV, b"", 300, lambda *_: None)
        )
    )
    thread.start()
    time.sleep(0.3)
    runner.cancel_all(signal.SIGTERM)
    thread.join(10)
    assert results
    assert results[0].cancelled
    later = runner.run(("/bin/true",), BASE_ENV, b"", 5, lambda *_: None)
    assert later.cancelled
    assert later.exit_status is None


def test_the_hook_environment_is_minimal_and_explicit():
    env = hook_environment(EVENT, "drain", 7, "vm", {"X": "1"})
    assert env["PATH"] == BASE_ENV["PATH"]
    assert env["SCHEDULED_EVENT_RESOURCES"] == "vm vm2"
    assert env["SCHEDULED_EVENT_NOT_BEFORE"] == "2030-01-01T12:00:00Z"
    assert env["SCHEDULED_EVENT_DURATION_SECONDS"] == ""
    assert env["SCHEDULED_EVENT_DOCUMENT_INCARNATION"] == "7"
    assert env["X"] == "1"
    assert set(env) - set(BASE_ENV) - {"X"} == {k for k in env if k.startswith("SCHEDULED_EVENT_")}
    assert b'"DocumentIncarnation": 7' in hook_stdin(EVENT, 7, "vm")
