"""The real daemon keeps two promises of the security page: only root may change what runs as
root (the config file, at start and at reload), and a lock keeps a second daemon off the state
directory, whatever the directory's condition (read-only, impossible to make)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import VM, Daemon, DaemonFactory
from tests.system.test_robustness import on_read_only_state_dir, one_hook

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces need root")

WHY = "it says what the daemon runs as root"


def _start_as_is(daemons: DaemonFactory, path: Path, prefix: tuple[str, ...] = ()) -> Daemon:
    """The daemon on a config file written (and its mode set) by the test."""
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(Path(__file__).parents[2])}
    daemon = Daemon(path, env, prefix)
    daemons.started.append(daemon)
    return daemon


def _handles_the_event_alone(first: Daemon, sim: Any, hooks: Any) -> None:
    """The first daemon, the one left running, runs the hook once and approves."""
    event_id = sim.add_event("Reboot", [VM])
    first.wait_log("event_approved", event_id=event_id)
    assert hooks.order() == ["a"]


def _under_a_file(
    daemons: DaemonFactory, hooks: Any, tmp_path: Path
) -> tuple[Path, dict[str, Any], Daemon]:
    """A daemon whose state_dir is under a file (it cannot be made): it runs degraded."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    daemons.state_dir = blocker / "state"
    cfg = one_hook(daemons, hooks)
    first = daemons.start(cfg)
    assert first.wait_log("state_degraded")["level"] == "warning"
    return blocker, cfg, first


def test_run_refuses_a_config_file_others_can_write(daemons, hooks):
    """Before: `run` started on a 0666 config (any user could name the hooks root runs)."""
    path = daemons.write_config(one_hook(daemons, hooks))
    path.chmod(0o666)
    daemon = _start_as_is(daemons, path)
    assert daemon.proc.wait(30) == 2
    daemon.stop()
    assert f"error: {path}: writable by group or others; {WHY}" in daemon.output()
    assert "Traceback" not in daemon.output()
    assert not (daemons.state_dir / "lock").exists(), "refused before it took anything"


def test_a_reload_refuses_a_config_file_others_can_write_and_keeps_the_old_one(daemons, sim, hooks):
    """Before: SIGHUP read a 0666 config and its hooks were in force at once."""
    cfg = one_hook(daemons, hooks)
    daemon = daemons.start(cfg)
    path = daemons.write_config(
        dict(cfg, hooks={"b": [{"command": [hooks.recorder("b")]}]}, events={"Reboot": ["b"]})
    )
    path.chmod(0o666)
    daemon.signal(signal.SIGHUP)
    assert daemon.wait_log("config_reload_failed")["reason"] == "keeping the previous configuration"
    assert f"{path}: writable by group or others; {WHY}" in [
        r["error"] for r in daemon.logs("config_invalid")
    ]
    event_id = sim.add_event("Reboot", [VM])
    daemon.wait_log("event_approved", event_id=event_id)
    assert hooks.order() == ["a"], "the old configuration's hook ran"
    path.chmod(0o644)
    daemon.signal(signal.SIGHUP)
    daemon.wait_log("config_reloaded")
    assert daemon.proc.poll() is None
    assert daemon.stop() == 0


def _second_is_refused(daemons: DaemonFactory, second: Daemon) -> None:
    assert second.proc.wait(30) == 1, second.output()[-2000:]
    refusal = second.logs("state_unavailable")
    assert refusal, second.output()[-2000:]
    assert f"{daemons.state_dir} is in use by another scheduledeventsd" in refusal[0]["error"]
    assert not second.logs("hook_started")


@needs_root
def test_a_second_daemon_is_refused_on_a_read_only_state_dir(daemons, sim, hooks):
    """Both daemons see one read-only tmpfs (the second enters the first's mount namespace).
    Before: the lock file could not be made, both ran degraded, both ran the hooks and both
    approved. The first still runs, degraded, and handles the event."""
    cfg = one_hook(daemons, hooks)
    first = on_read_only_state_dir(daemons, cfg)
    path = daemons.write_config(cfg, "second.yaml")
    second = _start_as_is(daemons, path, ("nsenter", "-t", str(first.proc.pid), "-m", "--"))
    _second_is_refused(daemons, second)
    _handles_the_event_alone(first, sim, hooks)
    assert first.proc.poll() is None
    assert first.stop() == 0


def test_a_second_daemon_is_refused_when_the_state_dir_cannot_be_made(
    daemons, sim, hooks, tmp_path
):
    """A state_dir under a file cannot be made: the daemon runs degraded, and the directory
    above it that exists holds the lock. Before: no lock at all, two daemons ran."""
    _, cfg, first = _under_a_file(daemons, hooks, tmp_path)
    second = _start_as_is(daemons, daemons.write_config(cfg, "second.yaml"))
    _second_is_refused(daemons, second)
    _handles_the_event_alone(first, sim, hooks)
    assert first.stop() == 0


@needs_root
def test_a_daemon_started_once_a_read_only_state_dir_is_writable_again_is_refused(
    daemons, sim, hooks
):
    """The first daemon starts on a read-only tmpfs with no `lock` (it locks the directory);
    the file system is remounted read-write and a second daemon (same mount namespace) can make
    `lock`. Before (review5): the second locked `lock`, a different inode, and ran too."""
    import subprocess  # noqa: PLC0415

    cfg = one_hook(daemons, hooks)
    first = on_read_only_state_dir(daemons, cfg)
    inside = ("nsenter", "-t", str(first.proc.pid), "-m", "--")
    subprocess.run([*inside, "mount", "-o", "remount,rw", str(daemons.state_dir)], check=True)
    second = _start_as_is(daemons, daemons.write_config(cfg, "second.yaml"), inside)
    _second_is_refused(daemons, second)
    _handles_the_event_alone(first, sim, hooks)
    assert first.stop() == 0


def test_a_daemon_started_once_the_state_dir_can_be_made_is_refused(daemons, sim, hooks, tmp_path):
    """The first daemon starts while its state_dir cannot be made (it locks the directory
    above); then the admin makes it, and a second daemon makes `lock` in it. Before (review5):
    the second locked `lock` and ran too; both ran the hooks."""
    blocker, cfg, first = _under_a_file(daemons, hooks, tmp_path)
    blocker.unlink()
    daemons.state_dir.mkdir(mode=0o700, parents=True)
    second = _start_as_is(daemons, daemons.write_config(cfg, "second.yaml"))
    _second_is_refused(daemons, second)
    _handles_the_event_alone(first, sim, hooks)
    assert first.stop() == 0
