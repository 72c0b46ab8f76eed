"""The process runner with real processes: no shell, own process group, timeout, output lines."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import threading
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduledeventsd.config import Hook, HookCommand
from scheduledeventsd.host.hooks import (
    BASE_ENV,
    MAX_ENV_VALUE,
    MAX_LINE,
    MAX_LOGGED_LINES,
    Outcome,
    ProcessRunner,
    hook_environment,
    hook_stdin,
    run_hooks,
)
from scheduledeventsd.model import Event, parse_document
from scheduledeventsd.providers import aws
from tests.conftest import VM, wait_for

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
    assert time.monotonic() - started < 30, "a hook that ignores stdin blocked the runner"


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
    assert time.monotonic() - started < 60, "ended by its timeout, not by its own 300 s"
    pid = int(pidfile.read_text())
    time.sleep(0.2)
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        assert state == "Z", "the TERM-ignoring grandchild must be SIGKILLed"
    except ProcessLookupError:
        pass


def test_cancelling_a_run_stops_its_commands_refuses_new_ones_and_spares_other_runs():
    runner = ProcessRunner()
    results = {}

    def start(run):
        results[run] = runner.run(
            ("/bin/sleep", "300"), BASE_ENV, b"", 300, lambda *_: None, run=run
        )

    threads = [threading.Thread(target=start, args=(run,)) for run in (1, 2)]
    for thread in threads:
        thread.start()
    wait_for(lambda: runner.live_runs() == {1, 2}, what="both runs to start")
    runner.cancel(1)
    threads[0].join(10)
    assert results[1].cancelled
    assert 2 not in results, "another run is not touched"
    later = runner.run(("/bin/true",), BASE_ENV, b"", 5, lambda *_: None, run=1)
    assert later.cancelled
    assert later.exit_status is None
    runner.cancel(2)
    threads[1].join(10)
    assert results[2].cancelled


def test_a_command_that_fails_on_its_own_while_another_run_is_cancelled_is_a_failure():
    runner = ProcessRunner()
    results = {}
    sleeper = threading.Thread(
        target=lambda: results.setdefault(
            1, runner.run(("/bin/sleep", "300"), BASE_ENV, b"", 300, lambda *_: None, run=1)
        )
    )
    sleeper.start()
    wait_for(lambda: runner.live_runs() == {1}, what="the run to start")
    runner.cancel(1)
    failing = runner.run(("/bin/sh", "-c", "exit 3"), BASE_ENV, b"", 5, lambda *_: None, run=2)
    sleeper.join(10)
    assert failing.exit_status == 3
    assert not failing.cancelled, "cancellation is a fact of the process we signalled"
    assert results[1].cancelled


def test_a_command_we_signalled_that_still_exits_zero_was_cancelled_not_successful():
    """A drain we interrupted did not finish, whatever its exit status says."""
    runner = ProcessRunner()
    results = []
    script = "trap 'exit 0' TERM; echo up; while :; do sleep 0.05; done"
    lines = []
    thread = threading.Thread(
        target=lambda: results.append(
            runner.run(
                ("/bin/sh", "-c", script), BASE_ENV, b"", 60, lambda *a: lines.append(a), run=7
            )
        )
    )
    thread.start()
    wait_for(lambda: lines, what="the command to start")
    runner.cancel(7)
    thread.join(10)
    assert results[0].exit_status == 0
    assert results[0].cancelled
    assert not results[0].succeeded
    assert results[0].outcome is Outcome.CANCELLED


def test_an_output_sink_that_raises_does_not_stop_the_draining_of_the_pipe():
    calls = []

    def broken(stream, line):
        calls.append(line)
        raise OSError("journald is gone")

    script = "i=0; while [ $i -lt 3000 ]; do echo line-$i-$(printf %040d 0); i=$((i+1)); done"
    result = ProcessRunner().run(("/bin/sh", "-c", script), BASE_ENV, b"", 20, broken)
    assert result.succeeded, "the pipe (64 KiB) would have filled and the hook hung"
    assert len(calls) == MAX_LOGGED_LINES  # then past the budget: drained, counted
    assert result.dropped_lines == 3000 - MAX_LOGGED_LINES


def test_environment_values_are_bounded_so_a_huge_description_still_runs(tmp_path):
    huge = Event(
        "E1", "Reboot", "Scheduled", "VirtualMachine", ("vm",), None, "é" * 200_000, "", None
    )
    env = hook_environment(huge, "h", 1, "vm", {})
    value = env["SCHEDULED_EVENT_DESCRIPTION"]
    assert len(value.encode()) <= MAX_ENV_VALUE
    assert value.endswith("the whole event is on stdin]")
    assert "400000 bytes" in value
    stdin = hook_stdin(huge, 1, "vm")
    result, lines = run(
        ["/bin/sh", "-c", 'echo "${#SCHEDULED_EVENT_DESCRIPTION}"; wc -c'], env=env, stdin=stdin
    )
    assert result.succeeded, result.error
    assert int(lines[1][1].strip()) == len(stdin), "the whole event still arrives on stdin"


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


# ---- hostile output and leftovers (issue 16) ------------------------------------------------


def test_a_line_without_end_is_cut_and_its_100_mb_cost_no_memory():
    """100 MB without a newline took the daemon from 17 to 216 MB RSS."""
    before = _rss_mb()
    result, lines = run(["/bin/sh", "-c", "head -c 100000000 /dev/zero | tr '\\0' x; exit 3"])
    assert result.exit_status == 3, "the hook's exit status still decides"
    (line,) = lines
    assert line[1].endswith(f" [cut: longer than {MAX_LINE} bytes]")
    assert len(line[1]) < MAX_LINE + 100
    assert _rss_mb() - before < 20, "the output was not kept"


def test_past_the_runs_budget_output_is_drained_and_counted_not_logged():
    result, lines = run(["/bin/sh", "-c", "seq 200000"])
    assert result.succeeded
    assert len(lines) == MAX_LOGGED_LINES
    assert lines[-1] == ("stdout", str(MAX_LOGGED_LINES))
    assert result.dropped_lines == 200000 - MAX_LOGGED_LINES
    assert result.dropped_bytes == len(
        "".join(f"{n}\n" for n in range(MAX_LOGGED_LINES + 1, 200001))
    )


def test_one_budget_covers_every_command_of_a_run(tmp_path):
    hook = Hook("h", (HookCommand(("/usr/bin/seq", "700")), HookCommand(("/usr/bin/seq", "700"))))
    logged, finished = [], []
    failure = run_hooks(
        ProcessRunner(),
        hooks=(hook,),
        event=EVENT,
        incarnation=1,
        vm_name="vm",
        extra_env={},
        on_started=lambda *a: None,
        on_finished=lambda hook, result: finished.append(result),
        on_output=lambda hook, stream, line: logged.append(line),
    )
    assert failure is None
    assert len(logged) == MAX_LOGGED_LINES
    assert [r.dropped_lines for r in finished] == [0, 1400 - MAX_LOGGED_LINES]


def test_a_successful_run_leaves_no_process_of_its_group_behind(tmp_path):
    """`sleep 300 &` in a hook used to outlive the run, whatever its outcome."""
    pidfile = tmp_path / "pid"
    result, _ = run(["/bin/sh", "-c", f"sleep 300 & echo $! > {pidfile}; exit 0"])
    assert result.succeeded
    pid = int(pidfile.read_text())
    wait_for(lambda: not _alive(pid), 10, "the background child to be stopped")


def test_a_child_that_left_the_group_keeps_neither_the_run_nor_its_output(tmp_path):
    """(setsid ... &) holds the pipes: the run took 4 s (two serial 2 s joins), kept two reader
    threads as long as the grandchild lived, and logged its later output under the run."""
    pidfile = tmp_path / "pid"
    script = f"(setsid sh -c 'echo $$ > {pidfile}; sleep 2; echo late; sleep 20' &); echo early"
    threads_before = threading.active_count()
    try:
        result, lines = run(["/bin/sh", "-c", script])
        assert result.succeeded
        assert lines == [("stdout", "early")]
        wait_for(lambda: threading.active_count() <= threads_before, 5, "its readers to end")
        time.sleep(2.5)  # past the grandchild's "late"
        assert lines == [("stdout", "early")], "output after the run is not the run's"
    finally:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError, ValueError):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _rss_mb() -> float:
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


# Every code point, lone surrogates included (Hypothesis' text leaves them out by default).
any_text = st.text(st.characters(blacklist_categories=()), max_size=20)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(any_text, any_text)
def test_any_text_a_cloud_sends_gives_an_environment_and_stdin_a_command_starts_with(text, name):
    """`"Description": "Host update \\ud800"` is valid JSON; the lone surrogate could not be
    encoded into the environment, and every hook failed to start. Azure's and AWS's text alike
    reach the hook as UTF-8 (U+FFFD for what cannot be encoded), on stdin as JSON."""
    azure = {"EventId": "E1", "EventType": "Reboot", "EventStatus": "Scheduled"}
    azure.update(Resources=["vm", name], Description=text, EventSource=text, ResourceType=text)
    body = json.dumps({"DocumentIncarnation": 1, "Events": [azure]}).encode()
    notice = {"Code": "system-reboot", "EventId": "instance-event-1", "State": "active"}
    notice.update(Description=text, NotBefore="21 Jan 2019 09:00:43 GMT", Other=[name])
    for event in (
        *parse_document(body).events,
        *aws.document_of(None, json.dumps([notice]).encode(), vm_name="i-1", now=1e9).events,
    ):
        env = hook_environment(event, "h", 1, "vm", {})
        for key, value in env.items():
            assert "\x00" not in value
            (key + value).encode()  # as the kernel gets it: no surrogateescape
        document = json.loads(hook_stdin(event, 1, "vm").decode())
        assert json.dumps(document, ensure_ascii=False).encode()


def test_a_command_that_cannot_be_started_is_logged_with_its_reason(daemons, sim, hooks):
    """The drain hook was checked at load, then removed: hook_failed says why (a guard beside
    the engine's test for runs that end without any command's result)."""
    drain = hooks.recorder("drain")
    cfg = daemons.config(hooks={"drain": [{"command": [drain]}]}, events={"Reboot": ["drain"]})
    daemon = daemons.start(cfg)
    os.remove(drain)
    event_id = sim.add_event("Reboot", [VM])
    failed = daemon.wait_log("hook_failed", event_id=event_id)
    assert "No such file or directory" in failed["error"]
    assert failed["exit_status"] is None
    assert daemon.wait_log("event_not_approved", event_id=event_id)["cause"] == "hooks_failed"
