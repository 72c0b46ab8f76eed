"""Run hook commands as processes: argv only (never a shell), own process group, hard timeout.

Knows processes and nothing of IMDS. Each command runs in a new session so that a timeout
can kill everything it started (SIGTERM to the group, then SIGKILL), not just the direct child.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Callable, Optional

from .config import Hook
from .model import Event, iso_utc

BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
}
KILL_GRACE = 5.0  # seconds between SIGTERM and SIGKILL to a timed-out hook's group
OUTPUT_DRAIN = 2.0  # how long to wait for output from processes a finished hook left behind
MAX_LINE = 4096


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    exit_status: Optional[int]  # None: it never ran, or was killed
    duration_s: float
    timed_out: bool = False
    cancelled: bool = False
    error: str = ""  # why it could not be started

    @property
    def succeeded(self) -> bool:
        return self.exit_status == 0


OutputSink = Callable[[str, str], None]  # (stream name, line)


class ProcessRunner:
    """The one place the daemon starts processes; it can cancel all of them at shutdown."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: set[subprocess.Popen[bytes]] = set()
        self._cancelled = threading.Event()

    def cancel_all(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Signal every running process group; commands not yet started will not start."""
        self._cancelled.set()
        with self._lock:
            live = list(self._live)
        for proc in live:
            _signal_group(proc, sig)

    def run(
        self,
        argv: tuple[str, ...],
        env: Mapping[str, str],
        stdin: bytes,
        timeout: float,
        on_output: OutputSink,
    ) -> CommandResult:
        started = time.monotonic()
        if self._cancelled.is_set():
            return CommandResult(argv, None, 0.0, cancelled=True, error="daemon is stopping")
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
        with self._lock:
            self._live.add(proc)
        try:
            readers = [
                _start(_pump, proc.stdout, "stdout", on_output),
                _start(_pump, proc.stderr, "stderr", on_output),
            ]
            _start(_feed, proc.stdin, stdin)
            timed_out = _wait(proc, timeout)
            for reader in readers:
                reader.join(OUTPUT_DRAIN)
        finally:
            with self._lock:
                self._live.discard(proc)
        cancelled = self._cancelled.is_set() and proc.returncode != 0
        status = None if timed_out or proc.returncode < 0 else proc.returncode
        return CommandResult(
            argv,
            status,
            time.monotonic() - started,
            timed_out=timed_out,
            cancelled=cancelled,
            error=f"killed by signal {-proc.returncode}" if proc.returncode < 0 else "",
        )


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Block in waitpid (Popen.wait with a timeout polls, adding up to 50 ms to every hook);
    a timer enforces the timeout. Returns whether it expired."""
    exited = threading.Event()
    expired = threading.Event()

    def expire() -> None:
        if exited.is_set():
            return
        expired.set()
        _signal_group(proc, signal.SIGTERM)
        if not exited.wait(KILL_GRACE):
            _signal_group(proc, signal.SIGKILL)

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    proc.wait()
    exited.set()
    timer.cancel()
    if expired.is_set():
        # The leader is gone; its group may not be (children that ignore SIGTERM or outlive it).
        deadline = time.monotonic() + KILL_GRACE
        while _group_alive(proc) and time.monotonic() < deadline:
            time.sleep(0.1)
        _signal_group(proc, signal.SIGKILL)
    return expired.is_set()


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


def _pump(pipe: Optional[IO[bytes]], stream: str, on_output: OutputSink) -> None:
    if pipe is None:
        return
    with pipe:
        for raw in iter(pipe.readline, b""):
            line = raw.rstrip(b"\r\n").decode("utf-8", "replace")
            on_output(stream, line[:MAX_LINE])


def hook_environment(
    event: Event,
    hook: str,
    incarnation: int,
    vm_name: str,
    extra: Mapping[str, str],
) -> dict[str, str]:
    """A minimal, explicit environment: the daemon's own (proxies, NOTIFY_SOCKET...) never leaks."""
    env = dict(BASE_ENV)
    env.update(extra)
    env.update(
        {
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
            "SCHEDULED_EVENT_HOOK": hook,
        }
    )
    return env


def hook_stdin(event: Event, incarnation: int, vm_name: str) -> bytes:
    document = dict(event.to_json(), DocumentIncarnation=incarnation, VmName=vm_name)
    return (json.dumps(document, sort_keys=True) + "\n").encode()


HookStarted = Callable[[str, tuple[str, ...]], None]
HookFinished = Callable[[str, CommandResult], None]


def run_hooks(
    runner: ProcessRunner,
    *,
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
    for hook in hooks:
        env = hook_environment(event, hook.name, incarnation, vm_name, extra_env)
        for command in hook.commands:
            on_started(hook.name, command.argv)
            result = runner.run(
                command.argv, env, stdin, command.timeout, _tagged(on_output, hook.name)
            )
            on_finished(hook.name, result)
            if not result.succeeded:
                return result
    return None


def _tagged(on_output: Callable[[str, str, str], None], hook: str) -> OutputSink:
    return lambda stream, line: on_output(hook, stream, line)
