"""Shared fixtures: a real simulator on loopback, real hook scripts, the daemon as a process."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml
from hypothesis.internal.conjecture import providers

from scheduledeventsd.config import loader
from scheduledeventsd.runtime.daemon import Daemon as InProcessDaemon
from scheduledeventsd.simulators.azure import Simulator
from scheduledeventsd.simulators.scenario import Scenario

# The `cluster` fixture: a real 3-member etcd (tests/system/: test_fleet.py, test_slots.py).
pytest_plugins = ["tests.etcd_cluster", "tests.pacemaker_cluster"]


def _hypothesis_draws_no_local_constants() -> None:
    """Hypothesis now and then draws a constant it found in the source of a local module
    imported so far, so a derandomized test played other examples depending on which test
    files were collected with it (a mutant of test_promises was caught alone and missed when
    test_plan.py, which imports plan/, was collected too). Its pool of them is kept empty: an
    example depends on its test alone (test_promises' ...does_not_depend_on_the_modules...)."""
    none = providers.Constants()
    providers._get_local_constants = lambda: none
    providers.CONSTANTS_CACHE.cache.clear()


_hypothesis_draws_no_local_constants()

VM = "test-vm"


def cli(*args: str, timeout: float = 60, check: bool = False) -> subprocess.CompletedProcess[str]:
    """`python -m scheduledeventsd ARGS` from the repository, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "scheduledeventsd", *args],
        capture_output=True,
        text=True,
        check=check,
        cwd=Path(__file__).parents[1],
        timeout=timeout,
    )


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def processes_mentioning(text: str) -> list[tuple[int, str]]:
    """Live processes whose command line contains `text` (a test's private directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append((int(entry.name), cmdline.strip()))
    return found


@pytest.fixture(autouse=True)
def no_process_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fails a test that leaves a process running from its own tmp_path (its daemons, their
    hooks), and ends them. Set up before the test's other fixtures, so checked after they have
    all been torn down; module-wide machines live in directories of their own."""
    if "tmp_path" not in request.fixturenames:
        yield
        return
    base = str(request.getfixturevalue("tmp_path"))
    yield
    left = processes_mentioning(base)
    deadline = time.monotonic() + 3
    while left and time.monotonic() < deadline:  # a hook killed a moment ago is still exiting
        time.sleep(0.05)
        left = processes_mentioning(base)
    for pid, _ in left:  # their whole group: a hook's children do not name the directory
        with contextlib.suppress(ProcessLookupError):
            group = os.getpgid(pid)
            os.kill(pid, signal.SIGKILL)
            if group != os.getpgrp():
                os.killpg(group, signal.SIGKILL)
    assert not left, f"processes left behind: {left}"


@pytest.fixture
def sim() -> Iterator[Simulator]:
    # Tests poll 4 times a second to run fast; IMDS' 5 requests/s limit is tested on its own.
    simulator = Simulator(
        Scenario(vm_name=VM, start_after_approval=0.5, started_for=1.0), rate_limit=False
    )
    simulator.start()
    yield simulator
    simulator.stop()


class Hooks:
    """Writes executable hook scripts into a private directory."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "hooks"
        self.dir.mkdir()
        self.out = root / "out"
        self.out.mkdir()

    def make(self, name: str, body: str) -> str:
        path = self.dir / name
        path.write_text(f"#!/bin/sh\nOUT={self.out}\n{body}\n")
        path.chmod(0o755)
        return str(path)

    def recorder(self, name: str, extra: str = "") -> str:
        """A hook that appends its name to `order` and saves its env and stdin."""
        return self.make(
            name,
            f'echo {name} >> "$OUT/order"\n'
            f'env > "$OUT/{name}.env"\n'
            f'cat > "$OUT/{name}.stdin"\n'
            f"{extra}",
        )

    def order(self) -> list[str]:
        path = self.out / "order"
        return path.read_text().split() if path.exists() else []


@pytest.fixture
def hooks(tmp_path: Path) -> Hooks:
    return Hooks(tmp_path)


class Daemon:
    """`scheduledeventsd run` as a subprocess, its JSON log lines collected as they come."""

    def __init__(
        self,
        config_path: Path,
        env: dict[str, str],
        prefix: tuple[str, ...] = (),
        args: tuple[str, ...] = (),
    ) -> None:
        self.config_path = config_path
        self.records: list[dict[str, Any]] = []
        self.raw_lines: list[str] = []
        self._lock = threading.Lock()
        self.proc = subprocess.Popen(
            [
                *prefix,
                sys.executable,
                "-m",
                "scheduledeventsd",
                "run",
                "--config",
                str(config_path),
                "--log-format",
                "json",
                "--log-target",
                "console",
                "--log-level",
                "debug",
                *args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self._lock:
                self.raw_lines.append(line)
                with contextlib.suppress(ValueError):
                    self.records.append(json.loads(line))

    def logs(self, name: str, **fields: Any) -> list[dict[str, Any]]:
        with self._lock:
            return [
                r
                for r in self.records
                if r.get("event") == name and all(r.get(k) == v for k, v in fields.items())
            ]

    def polls_seen(self, sim: Simulator, count: int = 3, timeout: float = 10.0) -> None:
        """Wait until the simulator has answered `count` more GETs of the document: the
        synchronisation point before asserting that nothing happened."""
        start = sim.gets()
        wait_for(lambda: sim.gets() >= start + count, timeout, f"{count} more polls")

    def wait_log(self, name: str, timeout: float = 10.0, **fields: Any) -> dict[str, Any]:
        found = wait_for(lambda: self.logs(name, **fields), timeout, f"log {name} {fields}")
        return found[0]

    def signal(self, signo: int) -> None:
        self.proc.send_signal(signo)

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._reader.join(5)
        return code

    def output(self) -> str:
        with self._lock:
            return "\n".join(self.raw_lines)


class DaemonFactory:
    def __init__(self, tmp_path: Path, sim: Simulator) -> None:
        self.tmp_path = tmp_path
        self.sim = sim
        self.state_dir = tmp_path / "state"
        self.started: list[Daemon] = []

    def config(self, **overrides: Any) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "metadata": {
                "url": self.sim.url,
                "poll_interval": 0.25,
                "timeout": 2,
                "first_call_timeout": 5,
            },
            "state_dir": str(self.state_dir),
            "hooks": {},
            "events": {},
        }
        for key, value in overrides.items():
            if isinstance(value, dict) and isinstance(cfg.get(key), dict) and key == "metadata":
                cfg[key] = {**cfg[key], **value}
            else:
                cfg[key] = value
        return cfg

    def write_config(self, cfg: dict[str, Any], name: str = "config.yaml") -> Path:
        path = self.tmp_path / name
        path.write_text(yaml.safe_dump(cfg))
        return path

    def start(
        self,
        cfg: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        ready: bool = True,
        prefix: tuple[str, ...] = (),
        args: tuple[str, ...] = (),
        config_name: str = "config.yaml",
    ) -> Daemon:
        """`prefix` runs the daemon through a wrapper, e.g. `unshare -m sh -c '...' sh`."""
        path = self.write_config(cfg if cfg is not None else self.config(), config_name)
        full_env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(Path(__file__).parents[1])}
        full_env.update(env or {})
        daemon = Daemon(path, full_env, prefix, args)
        self.started.append(daemon)
        if ready:
            try:
                daemon.wait_log("document_changed")
            except AssertionError as e:
                raise AssertionError(f"{e}; the daemon said:\n{daemon.output()[-3000:]}") from None
        return daemon

    def stop_all(self) -> None:
        for daemon in self.started:
            daemon.stop()

    def defects(self) -> list[dict[str, Any]]:
        """What no daemon may ever log: a change of phase the lifecycle table does not
        declare, or an exception it had to survive (the daemon carries on; the test fails)."""
        return [
            r
            for daemon in self.started
            for r in daemon.records
            if r.get("event") in ("transition_refused", "internal_error")
        ]


def stop_checked(factories: Iterable[DaemonFactory]) -> None:
    """Stop the daemons of several factories (one per VM); fail if any logged a defect."""
    factories = list(factories)
    for factory in factories:
        factory.stop_all()
    defects = [d for factory in factories for d in factory.defects()]
    assert not defects, defects


@pytest.fixture
def daemons(tmp_path: Path, sim: Simulator) -> Iterator[DaemonFactory]:
    factory = DaemonFactory(tmp_path, sim)
    yield factory
    factory.stop_all()
    assert not factory.defects(), factory.defects()


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    """systemd's side of sd_notify: a datagram socket to point NOTIFY_SOCKET at."""
    path = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.05)
    yield path, sock
    sock.close()


def receive(sock: socket.socket) -> list[dict[str, str]]:
    """Every datagram waiting on a notify socket, as key=value maps."""
    out = []
    while True:
        try:
            data = sock.recv(4096)
        except (TimeoutError, socket.timeout):
            return out
        out.append(dict(line.split("=", 1) for line in data.decode().splitlines()))


@pytest.fixture
def in_process(sim: Simulator, hooks: Hooks, tmp_path: Path) -> Iterator[Any]:
    """The daemon in this process, so a fault can be put into one of its steps or effects:
    (daemon, its unstarted thread, the structlog capture, its metrics textfile)."""
    capture = structlog.testing.LogCapture()
    structlog.configure(processors=[capture])
    cfg = loader.parse(
        {
            "metadata": {"url": sim.url, "poll_interval": 0.25, "first_call_timeout": 5},
            "vm_name": VM,
            "state_dir": str(tmp_path / "state"),
            "hooks": {"a": [{"command": [hooks.recorder("a")]}]},
            "events": {"Reboot": ["a"]},
            "metrics_textfile": str(tmp_path / "scheduledeventsd.prom"),
        },
        "test",
    )
    daemon = InProcessDaemon(cfg)
    thread = threading.Thread(target=daemon.run)
    yield daemon, thread, capture, tmp_path / "scheduledeventsd.prom"
    daemon.request_stop()
    thread.join(20)
    structlog.reset_defaults()
    assert not thread.is_alive()


def logging_fails_on(name: str) -> Callable[..., Any]:
    """A structlog processor that raises on one record, as a journald send error would."""

    def explode(_logger: object, _method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
        if event_dict.get("event") == name:
            raise OSError("journald is gone")
        return event_dict

    return explode


PREVIOUS_RELEASE = "ce2ef65"  # the release before the phase `rebooted` (state file version 2)


@pytest.fixture(scope="session")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's package, taken from git, to run beside this one (a rollback):
    put its directory first on PYTHONPATH and run it from another directory (python -m takes
    the package from its working directory first). Skipped where git lacks that commit."""
    root = Path(__file__).parents[1]
    try:
        archive = subprocess.run(
            ["git", "-C", str(root), "archive", PREVIOUS_RELEASE, "scheduledeventsd"],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"the previous release {PREVIOUS_RELEASE} is not in this checkout: {e}")
    where = tmp_path_factory.mktemp("previous-release")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(where, filter="data")
    return where
