"""Run hook commands as processes: argv only (never a shell), own process group, hard timeout.

Knows processes and nothing of IMDS. Each command runs in a new session so that a timeout
can kill everything it started (SIGTERM to the group, then SIGKILL), not just the direct child.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Callable, Optional

from ..config import Hook
from ..engine.vocabulary.constants import GATE_LATER, KILL_GRACE, Outcome
from ..model import Event, encodable, iso_utc

BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
}
# When a command ends, what is left of its process group gets SIGTERM, then SIGKILL this much
# later, and its output readers stop within this much (a process that left the group with
# setsid may hold the pipes: it is not waited for). Lasting work belongs in `systemd-run`.
LEFTOVER_GRACE = 1.0
MAX_LINE = 4096  # bytes of one output line that are logged; the rest is cut with a marker
# Logged per run (every command of a stage, stdout and stderr together); past it the output is
# still drained, so the hook never blocks, and only counted: hook_output_truncated.
MAX_LOGGED_LINES = 1000
MAX_LOGGED_BYTES = 256 * 1024
_CHUNK = 65536
# One environment string may hold 128 KiB on Linux and all of them together about 2 MiB: an
# event with a 200 kB Description would fail to start with E2BIG. Values are cut to this many
# bytes with a marker; the whole event is on stdin.
MAX_ENV_VALUE = 8192


class OutputBudget:
    """How much of one run's output is still to be logged; what is past it is counted."""

    def __init__(self, lines: int = MAX_LOGGED_LINES, size: int = MAX_LOGGED_BYTES) -> None:
        self._lock = threading.Lock()
        self._lines = lines
        self._bytes = size
        self.dropped_lines = 0
        self.dropped_bytes = 0

    @property
    def spent(self) -> bool:
        return self._lines <= 0 or self._bytes <= 0

    def take(self, size: int) -> bool:
        """One line of `size` bytes: True if it is to be logged."""
        with self._lock:
            if self._lines > 0 and self._bytes > 0:
                self._lines -= 1
                self._bytes -= size
                return True
            self.dropped_lines += 1
            self.dropped_bytes += size
            return False

    def drop(self, lines: int, size: int) -> None:
        with self._lock:
            self.dropped_lines += lines
            self.dropped_bytes += size


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    exit_status: Optional[int]  # None: it never ran, or was killed
    duration_s: float
    timed_out: bool = False
    cancelled: bool = False  # we stopped it: it did not finish, whatever its exit status
    error: str = ""  # why it could not be started
    dropped_lines: int = 0  # output past the run's logging budget: drained, counted, not logged
    dropped_bytes: int = 0

    @property
    def outcome(self) -> Outcome:
        if self.cancelled:
            return Outcome.CANCELLED
        if self.exit_status == 0 and not self.timed_out:
            return Outcome.SUCCEEDED
        return Outcome.FAILED

    @property
    def succeeded(self) -> bool:
        return self.outcome is Outcome.SUCCEEDED

    def label(self, stage: str) -> str:
        """The `result` label of a hook run: ok | failed | timeout | cancelled, and not_yet
        for a gate that said "ask again later" (a normal wait, not a failure)."""
        if stage == "gate" and self.exit_status == GATE_LATER and not self.cancelled:
            return "not_yet"
        if self.timed_out:
            return "timeout"
        outcome = self.outcome
        if outcome is Outcome.SUCCEEDED:
            return "ok"
        return "cancelled" if outcome is Outcome.CANCELLED else "failed"


OutputSink = Callable[[str, str], None]  # (stream name, line)


class _Running:
    """One started command. Whether *we* stopped it (timeout or cancel) is a fact of this
    process, never of the runner as a whole: a hook that fails on its own while the daemon is
    stopping has failed, it was not cut off."""

    def __init__(self, proc: subprocess.Popen[bytes], run: Optional[int]) -> None:
        self.proc = proc
        self.run = run
        self.exited = threading.Event()
        self.reason = ""  # "timeout" | "cancel": why we signalled it
        self._lock = threading.Lock()

    def stop(self, reason: str) -> None:
        """SIGTERM to its process group, SIGKILL KILL_GRACE later if it has not exited."""
        with self._lock:
            if self.reason or self.exited.is_set():
                return
            self.reason = reason
        _signal_group(self.proc, signal.SIGTERM)
        _start(self._kill_later)

    def _kill_later(self) -> None:
        if not self.exited.wait(KILL_GRACE):
            _signal_group(self.proc, signal.SIGKILL)


class ProcessRunner:
    """The one place the daemon starts processes; runs can be cancelled one by one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: set[_Running] = set()
        self._cancelled: set[Optional[int]] = set()

    def cancel(self, *runs: Optional[int]) -> None:
        """Stop the runs' processes; their commands not yet started will not start."""
        with self._lock:
            self._cancelled.update(runs)
            live = [r for r in self._live if r.run in runs]
        for running in live:
            running.stop("cancel")

    def forget(self, run: Optional[int]) -> None:
        with self._lock:
            self._cancelled.discard(run)

    def live_runs(self) -> set[Optional[int]]:
        with self._lock:
            return {r.run for r in self._live}

    def run(
        self,
        argv: tuple[str, ...],
        env: Mapping[str, str],
        stdin: bytes,
        timeout: float,
        on_output: OutputSink,
        *,
        run: Optional[int] = None,
        budget: Optional[OutputBudget] = None,
    ) -> CommandResult:
        started = time.monotonic()
        budget = budget if budget is not None else OutputBudget()
        lines_before, bytes_before = budget.dropped_lines, budget.dropped_bytes
        with self._lock:
            if run in self._cancelled:
                return CommandResult(argv, None, 0.0, cancelled=True, error="cancelled")
        try:
            proc = subprocess.Popen(  # noqa: S603 - argv from validated config, no shell
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=dict(env),
                cwd="/",
                close_fds=True,
                start_new_session=True,
            )
        except (OSError, ValueError) as e:
            return CommandResult(argv, None, time.monotonic() - started, error=str(e))
        running = _Running(proc, run)
        with self._lock:
            self._live.add(running)
            cancel_now = run in self._cancelled  # cancelled while it was being started
        stop = threading.Event()
        try:
            if cancel_now:
                running.stop("cancel")
            try:
                readers = [
                    _start(_pump, proc.stdout, "stdout", on_output, budget, stop),
                    _start(_pump, proc.stderr, "stderr", on_output, budget, stop),
                ]
                _start(_feed, proc.stdin, stdin)
            except RuntimeError as e:  # no thread for it: never leave the process running
                running.stop("cancel")
                proc.wait()
                _signal_group(proc, signal.SIGKILL)
                return CommandResult(argv, None, time.monotonic() - started, error=str(e))
            _wait(running, timeout)
            deadline = time.monotonic() + LEFTOVER_GRACE
            for reader in readers:
                reader.join(max(0.0, deadline - time.monotonic()))
            stop.set()  # a process that escaped the group may still hold the pipes
            for reader in readers:
                reader.join(LEFTOVER_GRACE)
        finally:
            with self._lock:
                self._live.discard(running)
        code = proc.returncode
        status = None if running.reason == "timeout" or code < 0 else code
        return CommandResult(
            argv,
            status,
            time.monotonic() - started,
            timed_out=running.reason == "timeout",
            cancelled=running.reason == "cancel",
            error=f"killed by signal {-code}" if code < 0 else "",
            dropped_lines=budget.dropped_lines - lines_before,
            dropped_bytes=budget.dropped_bytes - bytes_before,
        )


def _wait(running: _Running, timeout: float) -> None:
    """Block in waitpid (Popen.wait with a timeout polls, adding up to 50 ms to every hook);
    a timer enforces the timeout."""
    proc = running.proc
    timer = threading.Timer(timeout, running.stop, args=("timeout",))
    timer.daemon = True
    timer.start()
    proc.wait()
    running.exited.set()
    timer.cancel()
    # The leader is gone; its group may not be: children that ignore SIGTERM, or that it left
    # running in the background. A run leaves nothing behind, whether it succeeded or not.
    if not running.reason and _group_alive(proc):
        _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + (KILL_GRACE if running.reason else LEFTOVER_GRACE)
    while _group_alive(proc) and time.monotonic() < deadline:
        time.sleep(0.05)
    _signal_group(proc, signal.SIGKILL)


def _group_alive(proc: subprocess.Popen[bytes]) -> bool:
    try:
        os.killpg(proc.pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _start(target: Callable[..., None], *args: object) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _feed(pipe: Optional[IO[bytes]], data: bytes) -> None:
    """In its own thread: a hook that never reads stdin must not block the runner."""
    if pipe is None:
        return
    with contextlib.suppress(BrokenPipeError, OSError):
        pipe.write(data)
    with contextlib.suppress(BrokenPipeError, OSError):
        pipe.close()


def _pump(
    pipe: Optional[IO[bytes]],
    stream: str,
    on_output: OutputSink,
    budget: OutputBudget,
    stop: threading.Event,
) -> None:
    """Drain a pipe to its end, or until `stop`: lines logged within the budget (each cut at
    MAX_LINE), the rest counted without being split, so no output can cost memory or CPU in
    proportion to its size, and the hook never blocks on a full pipe."""
    if pipe is None:
        return
    with pipe:
        fd = pipe.fileno()
        os.set_blocking(fd, False)
        line = _Line(stream, on_output, budget)
        while not stop.is_set():
            if not select.select([fd], [], [], 0.1)[0]:
                continue
            try:
                chunk = os.read(fd, _CHUNK)
            except BlockingIOError:
                continue
            if not chunk:
                break
            line.feed(chunk)
        line.end()


class _Line:
    """Splits one stream's bytes into lines and hands them to the sink."""

    def __init__(self, stream: str, on_output: OutputSink, budget: OutputBudget) -> None:
        self.stream = stream
        self.on_output = on_output
        self.budget = budget
        self.partial = bytearray()
        self.cut = False  # the current line was cut: its rest is dropped

    def feed(self, chunk: bytes) -> None:
        if self.budget.spent:  # only counted: no splitting, no decoding
            self.budget.drop(chunk.count(b"\n"), len(self.partial) + len(chunk))
            self.partial.clear()
            return
        *lines, rest = chunk.split(b"\n")
        for piece in lines:  # each ended in this chunk: any of them may be longer than MAX_LINE
            if self.cut:
                self.cut = False
            elif len(self.partial) + len(piece) > MAX_LINE:
                self._emit(bytes(self.partial + piece[: MAX_LINE - len(self.partial)]), cut=True)
            else:
                self._emit(bytes(self.partial + piece), newline=True)
            self.partial.clear()
        if self.cut:
            return
        self.partial += rest
        if len(self.partial) > MAX_LINE:
            self._emit(bytes(self.partial[:MAX_LINE]), cut=True)
            self.partial.clear()
            self.cut = True

    def end(self) -> None:
        if self.partial and not self.cut:
            self._emit(bytes(self.partial))

    def _emit(self, raw: bytes, *, cut: bool = False, newline: bool = False) -> None:
        """One line; its size as printed (with its newline) counts against the budget."""
        if not self.budget.take(len(raw) + newline):
            return
        text = raw.rstrip(b"\r").decode("utf-8", "replace")
        if cut:
            text += f" [cut: longer than {MAX_LINE} bytes]"
        # A failing log must not stop the draining: the pipe would fill and the hook hang.
        with contextlib.suppress(Exception):
            self.on_output(self.stream, text)


def hook_environment(
    event: Event,
    hook: str,
    incarnation: int,
    vm_name: str,
    extra: Mapping[str, str],
    *,
    stage: str = "before",
    rebooted: bool = False,
    now: Optional[float] = None,
) -> dict[str, str]:
    """A minimal, explicit environment: the daemon's own (proxies, NOTIFY_SOCKET...) never leaks.
    `now` (the wall clock, as the command starts) gives SCHEDULED_EVENT_SECONDS_LEFT."""
    env = dict(BASE_ENV)
    env.update(extra)
    event_env = {
        "SCHEDULED_EVENT_ID": event.event_id,
        "SCHEDULED_EVENT_TYPE": event.event_type,
        "SCHEDULED_EVENT_STATUS": event.status,
        "SCHEDULED_EVENT_RESOURCE_TYPE": event.resource_type,
        "SCHEDULED_EVENT_RESOURCES": " ".join(event.resources),
        "SCHEDULED_EVENT_NOT_BEFORE": iso_utc(event.not_before),
        "SCHEDULED_EVENT_DESCRIPTION": event.description,
        "SCHEDULED_EVENT_SOURCE": event.source,
        "SCHEDULED_EVENT_DURATION_SECONDS": ""
        if event.duration_seconds is None
        else str(event.duration_seconds),
        "SCHEDULED_EVENT_DOCUMENT_INCARNATION": str(incarnation),
        "SCHEDULED_EVENT_VM_NAME": vm_name,
        "SCHEDULED_EVENT_PROVIDER": event.provider,
        "SCHEDULED_EVENT_HOOK": hook,
        "SCHEDULED_EVENT_STAGE": stage,
        "SCHEDULED_EVENT_REBOOTED": "1" if rebooted else "0",
        "SCHEDULED_EVENT_SECONDS_LEFT": seconds_left(event, time.time() if now is None else now),
    }
    env.update({k: bounded(v) for k, v in event_env.items()})
    return env


def seconds_left(event: Event, now: float) -> str:
    """Whole seconds from `now` to NotBefore, never negative; empty without NotBefore."""
    if event.not_before is None:
        return ""
    return str(max(0, int(event.not_before.timestamp() - now)))


def bounded(value: str, limit: int = MAX_ENV_VALUE) -> str:
    """`value`, or its first bytes and a marker saying it was cut (on a UTF-8 boundary); what
    cannot be encoded (a lone surrogate) replaced, so the command can be started at all."""
    value = encodable(value)
    data = value.encode()
    if len(data) <= limit:
        return value
    marker = f" [truncated: {len(data)} bytes in all; the whole event is on stdin]"
    head = data[: limit - len(marker.encode())].decode("utf-8", "ignore")
    return head + marker


def hook_stdin(event: Event, incarnation: int, vm_name: str) -> bytes:
    document = dict(event.to_json(), DocumentIncarnation=incarnation, VmName=vm_name)
    if event.provider != "azure":  # beside the event as Azure spells it, the cloud's own words
        document["Provider"] = event.provider
        document["ProviderNotice"] = _notice(event.notice)
    # A lone surrogate in the cloud's own notice (valid JSON, and ProviderNotice gives it back
    # as it came) is replaced like every other event text; stdin stays ASCII, \u-escaped.
    text = json.dumps(document, sort_keys=True, ensure_ascii=False)
    clean = encodable(text)
    if clean != text:
        document = json.loads(clean)
    return (json.dumps(document, sort_keys=True) + "\n").encode()


def _notice(text: str) -> object:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


HookStarted = Callable[[str, tuple[str, ...]], None]
HookFinished = Callable[[str, CommandResult], None]


def run_hooks(
    runner: ProcessRunner,
    *,
    run: Optional[int] = None,
    stage: str = "before",
    rebooted: bool = False,
    hooks: tuple[Hook, ...],
    event: Event,
    incarnation: int,
    vm_name: str,
    extra_env: Mapping[str, str],
    on_started: HookStarted,
    on_finished: HookFinished,
    on_output: Callable[[str, str, str], None],
) -> Optional[CommandResult]:
    """Each hook's commands in order, stopping at the first failure, which is returned.

    None means every command succeeded; a returned result says whether it failed on its own or
    was cancelled by a stop (then the hooks did not finish and must run again).
    """
    stdin = hook_stdin(event, incarnation, vm_name)
    budget = OutputBudget()  # for the whole run
    for hook in hooks:
        for command in hook.commands:
            env = hook_environment(  # per command: its SECONDS_LEFT is from its own start
                event, hook.name, incarnation, vm_name, extra_env, stage=stage, rebooted=rebooted
            )
            on_started(hook.name, command.argv)
            result = runner.run(
                command.argv,
                env,
                stdin,
                command.timeout,
                _tagged(on_output, hook.name),
                run=run,
                budget=budget,
            )
            on_finished(hook.name, result)
            if not result.succeeded:
                return result
    return None


def _tagged(on_output: Callable[[str, str, str], None], hook: str) -> OutputSink:
    return lambda stream, line: on_output(hook, stream, line)
