"""The .deb as deployed: installed with apt into a Debian bookworm root, run by real systemd.

systemd boots as PID 1 of private PID/mount/network namespaces on a debootstrapped root (cached
between runs); the project's simulator answers on the real 169.254.169.254:80 inside the same
network namespace, so the shipped config runs unchanged. The tests are steps on one machine,
in file order: install, event, journal, reload, watchdog, verify, purge.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduledeventsd.simulators.aws import AwsSimulator
from tests.conftest import wait_for
from tests.pacemaker_cluster import in_netns

pytestmark = pytest.mark.xdist_group(name="deployed")  # steps on one machine, in file order

ROOT = Path(__file__).parents[2]
VM = "deployed-vm_3"
INCLUDE = ",".join(
    (
        "systemd",
        "systemd-sysv",
        "dbus",
        "iproute2",
        "procps",
        "man-db",
        # The package's dependencies, so that apt installs the .deb without a network.
        "python3-httptools",
        "python3-requests",
        "python3-yaml",
        "python3-systemd",
        "python3-structlog",
        "python3-prometheus-client",
    )
)
CACHE = Path(os.environ.get("SCHEDULEDEVENTSD_CI_CACHE", "/var/cache/scheduledeventsd-ci"))
IMDS = "http://169.254.169.254"


def _run(
    *argv: str, check: bool = True, timeout: float = 300, **kw: Any
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, check=False, **kw
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        )
    return result


def _mirror() -> str:
    text = Path("/etc/apt/sources.list.d/debian.sources").read_text()
    match = re.search(r"^URIs:\s*(\S+)", text, re.MULTILINE)
    return match.group(1) if match else "http://deb.debian.org/debian"


def _root_tarball(release: str) -> Path:
    """debootstrap once per release and package set (~75 s), then reuse the tarball (~3 s)."""
    key = hashlib.sha256(INCLUDE.encode()).hexdigest()[:12]
    tarball = CACHE / f"{release}-{key}.tar"
    if tarball.exists():
        return tarball
    _run(str(ROOT / "scripts/apt-need"), "debootstrap")
    CACHE.mkdir(parents=True, exist_ok=True)
    staging = CACHE / f"root-{release}-{key}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    _run(
        "debootstrap",
        "--variant=minbase",
        f"--include={INCLUDE}",
        release,
        str(staging),
        _mirror(),
        timeout=900,
    )
    # No serial console in a namespace: do not let its getty hold boot in "starting".
    _run("systemctl", f"--root={staging}", "mask", "serial-getty@ttyS0.service")
    _run("tar", "-C", str(staging), "-cf", f"{tarball}.tmp", ".")
    os.replace(f"{tarball}.tmp", tarball)
    shutil.rmtree(staging, ignore_errors=True)
    return tarball


class Machine:
    """A booted systemd in its own namespaces; `sh` runs a command inside it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        script = (
            f"mount --bind {root} {root}; mount -t proc proc {root}/proc; "
            f"mount -t sysfs sys {root}/sys; mount -t tmpfs tmpfs {root}/run; "
            f"mount -t tmpfs tmpfs {root}/tmp; "
            f"exec chroot {root} /lib/systemd/systemd --system --log-target=console"
        )
        self.console = open(root.parent / "console.log", "wb")  # noqa: SIM115 - lives as long as the machine
        self.unshare = subprocess.Popen(
            [
                "unshare",
                "--pid",
                "--fork",
                "--mount",
                "--uts",
                "--ipc",
                "--net",
                "bash",
                "-c",
                script,
            ],
            stdout=self.console,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self.pid = wait_for(self._systemd_pid, 20, "systemd to start")
        self.simulator: subprocess.Popen[bytes] | None = None

    def _systemd_pid(self) -> int | None:
        children = (
            Path(f"/proc/{self.unshare.pid}/task/{self.unshare.pid}/children").read_text().split()
        )
        for pid in children:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "systemd":
                return int(pid)
        return None

    def sh(
        self, *argv: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return _run(
            "nsenter",
            "-t",
            str(self.pid),
            "-m",
            "-p",
            "-u",
            "-i",
            "-n",
            "-r",
            "-w",
            *argv,
            check=check,
            timeout=timeout,
        )

    def net(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """Run a host program inside the machine's network namespace only."""
        return _run("nsenter", "-t", str(self.pid), "-n", *argv)

    def imds(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        code = (
            "import json,sys,requests;"
            f"r=requests.request({method!r},{IMDS + path!r},json={body!r},timeout=5);"
            "print(r.text)"
        )
        return json.loads(self.net(sys.executable, "-c", code).stdout)

    def journal(self, *matches: str) -> list[dict[str, Any]]:
        out = self.sh(
            "journalctl", "-u", "scheduledeventsd", "-o", "json", "--no-pager", *matches
        ).stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def unit(self, prop: str) -> str:
        return self.sh(
            "systemctl", "show", "-p", prop, "--value", "scheduledeventsd"
        ).stdout.strip()

    def stop(self) -> None:
        if self.simulator is not None:
            self.simulator.kill()
            self.simulator.wait()
        os.kill(self.pid, 9)  # PID 1 of its namespace ignores SIGTERM
        self.unshare.wait(20)
        self.console.close()


# Debian 12 and 13, each with its own systemd, Python and libraries (the .deb is the same).
@pytest.fixture(scope="module", params=["bookworm", "trixie"])
def machine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Machine]:
    if os.geteuid() != 0:
        pytest.fail(
            "the deployed tests boot systemd in namespaces and need root: run `sudo make test`"
        )
    _run(str(ROOT / "scripts/apt-need"), "iproute2", "util-linux", timeout=600)
    built = _run(str(ROOT / "scripts/build-deb"), timeout=600).stdout.split()
    deb = Path(ROOT / built[-1])
    tarball = _root_tarball(request.param)
    root = tmp_path_factory.mktemp("deployed") / "root"
    root.mkdir()
    _run("tar", "-C", str(root), "-xf", str(tarball))
    shutil.copy(deb, root / "root" / deb.name)
    m = Machine(root)
    try:
        m.net("ip", "link", "set", "lo", "up")
        m.net("ip", "addr", "add", "169.254.169.254/32", "dev", "lo")
        m.simulator = subprocess.Popen(
            [
                "nsenter",
                "-t",
                str(m.pid),
                "-n",
                sys.executable,
                "-m",
                "scheduledeventsd",
                "simulate",
                "--listen",
                "169.254.169.254:80",
                "--vm-name",
                VM,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=ROOT,
        )
        wait_for(
            lambda: m.sh("systemctl", "is-active", "dbus", check=False).stdout.strip() == "active",
            30,
            "dbus in the machine",
        )
        wait_for(lambda: _up(m), 10, "the simulator on 169.254.169.254:80")
        m.deb_name = deb.name  # type: ignore[attr-defined]
        yield m
    finally:
        m.stop()
        shutil.rmtree(root, ignore_errors=True)


def _up(m: Machine) -> bool:
    try:
        m.imds("GET", "/_simulator/state")
    except AssertionError:
        return False
    return True


def test_apt_installs_the_deb_and_the_service_starts_enabled(machine):
    out = machine.sh(
        "env",
        "DEBIAN_FRONTEND=noninteractive",
        "apt-get",
        "install",
        "-y",
        f"/root/{machine.deb_name}",
        timeout=300,
    )
    assert "Setting up scheduledeventsd" in out.stdout
    wait_for(lambda: machine.unit("ActiveState") == "active", 30, "the service to be active")
    assert machine.unit("UnitFileState") == "enabled"
    assert machine.unit("Type") == "notify"
    wait_for(
        lambda: "last poll ok" in machine.unit("StatusText"), 20, "a STATUS= naming the last poll"
    )
    assert VM in machine.unit("StatusText"), "vm_name: auto learned the name from IMDS"


def test_a_scheduled_event_runs_the_shipped_hooks_and_is_approved(machine):
    event_id = machine.imds("POST", "/_simulator/events", {"EventType": "Reboot"})["EventId"]
    wait_for(
        lambda: any(
            a["EventId"] == event_id for a in machine.imds("GET", "/_simulator/state")["approvals"]
        ),
        30,
        "the approval to reach IMDS",
    )
    records = machine.journal(f"EVENT_ID={event_id}")
    by_event = {r["LOG_EVENT"] for r in records}
    assert {
        "event_detected",
        "hook_started",
        "hook_output",
        "hook_finished",
        "event_approved",
    } <= by_event
    hooks_run = [r["HOOK"] for r in records if r["LOG_EVENT"] == "hook_finished"]
    assert hooks_run == ["drain", "checkpoint"]
    output = [r for r in records if r["LOG_EVENT"] == "hook_output"]
    assert all(r["EVENT_ID"] == event_id and r["HOOK"] in ("drain", "checkpoint") for r in output)
    approved = next(r for r in records if r["LOG_EVENT"] == "event_approved")
    assert approved["SYSLOG_IDENTIFIER"] == "scheduledeventsd"
    assert approved["PRIORITY"] == "6"
    assert approved["EVENT_TYPE"] == "Reboot"
    assert machine.journal("EVENT_TYPE=Reboot", "LOG_EVENT=event_approved")


def test_reload_applies_a_changed_config(machine):
    config = "/etc/scheduledeventsd/config.yaml"
    text = machine.sh("cat", config).stdout
    machine.sh("sed", "-i", "s/^approve: sole/approve: never/", config)
    pid = machine.unit("MainPID")
    machine.sh("systemctl", "reload", "scheduledeventsd")
    wait_for(lambda: machine.journal("LOG_EVENT=config_reloaded"), 15, "config_reloaded")
    assert machine.unit("MainPID") == pid, "reload keeps the process"
    event_id = machine.imds("POST", "/_simulator/events", {"EventType": "Freeze"})["EventId"]
    skipped = wait_for(
        lambda: machine.journal(f"EVENT_ID={event_id}", "LOG_EVENT=approval_skipped"),
        20,
        "the Freeze to be left unapproved under approve: never",
    )
    assert "never" in skipped[0]["REASON"]
    machine.sh("sh", "-c", f"cat > {config} <<'EOF'\n{text}EOF")


def test_event_text_cannot_inject_journal_fields(machine):
    """A resource name with newlines and KEY=value lines stays one field of one entry."""
    hostile = "x\nPWNED=1\nMESSAGE=pwned\nPRIORITY=0\x1b[31m"
    body = {"EventType": "Reboot", "Resources": [VM, hostile]}
    event_id = machine.imds("POST", "/_simulator/events", body)["EventId"]
    entries = wait_for(
        lambda: machine.journal(f"EVENT_ID={event_id}", "LOG_EVENT=event_detected"),
        20,
        "the event in the journal",
    )
    (entry,) = entries
    resources = entry["RESOURCES"]  # journalctl -o json gives bytes with control characters
    assert bytes(resources).decode() == f"{VM} {hostile}"
    for entry in machine.journal(f"EVENT_ID={event_id}"):
        assert "PWNED" not in entry
        assert entry.get("MESSAGE") != "pwned"
        assert entry.get("PRIORITY") != "0"


def test_a_reload_turns_on_health_and_metrics_with_debians_prometheus_client(machine):
    """The hardened unit may listen; Debian's python3-prometheus-client renders the metrics."""
    config = "/etc/scheduledeventsd/config.yaml"
    text = machine.sh("cat", config).stdout
    machine.sh("sed", "-i", "s/^  listen: null.*/  listen: 127.0.0.1:9650/", config)
    machine.sh("systemctl", "reload", "scheduledeventsd")
    wait_for(lambda: machine.journal("LOG_EVENT=http_listening"), 15, "http_listening")
    get = (
        "import sys, urllib.request as u, urllib.error as e\n"
        "try:\n"
        "    r = u.urlopen('http://127.0.0.1:9650' + sys.argv[1], timeout=5)\n"
        "except e.HTTPError as error:\n"
        "    r = error\n"
        "print(r.status); print(r.read().decode())"
    )
    for event in machine.imds("GET", "/_simulator/state")["events"]:  # earlier tests' events
        machine.imds("DELETE", f"/_simulator/events/{event['EventId']}")
    wait_for(
        lambda: machine.sh("python3", "-c", get, "/health").stdout.split() == ["200", "ok"],
        15,
        "/health to answer 200 with no event pending",
    )
    event_id = machine.imds("POST", "/_simulator/events", {"EventType": "Redeploy"})["EventId"]
    wait_for(
        lambda: (
            f"maintenance: Redeploy {event_id}"
            in machine.sh("python3", "-c", get, "/health").stdout
        ),
        15,
        "/health to answer 503 for the Redeploy",
    )
    metrics = machine.sh("python3", "-c", get, "/metrics").stdout
    assert 'scheduledeventsd_polls_total{result="ok"}' in metrics
    assert f'vm_name="{VM}"' in metrics
    status = machine.sh("scheduledeventsd", "status").stdout
    assert f"health: 503 for Redeploy {event_id}" in status
    machine.sh("sh", "-c", f"cat > {config} <<'EOF'\n{text}EOF")
    machine.sh("systemctl", "reload", "scheduledeventsd")


def test_a_stopped_daemon_is_killed_by_the_watchdog_and_restarted(machine):
    # The shipped WatchdogSec=30 works the same; a drop-in shortens the wait for the test.
    machine.sh("mkdir", "-p", "/etc/systemd/system/scheduledeventsd.service.d")
    machine.sh(
        "sh",
        "-c",
        "printf '[Service]\\nWatchdogSec=3\\n' "
        "> /etc/systemd/system/scheduledeventsd.service.d/wd.conf",
    )
    machine.sh("systemctl", "daemon-reload")
    machine.sh("systemctl", "restart", "scheduledeventsd")
    wait_for(lambda: machine.unit("ActiveState") == "active", 30, "restart")
    pid = machine.unit("MainPID")
    restarts = int(machine.unit("NRestarts"))
    time.sleep(5)
    assert machine.unit("MainPID") == pid, "a healthy loop keeps the watchdog fed"
    machine.sh("kill", "-STOP", pid)
    wait_for(lambda: int(machine.unit("NRestarts")) > restarts, 30, "a watchdog restart")
    wait_for(lambda: machine.unit("ActiveState") == "active", 30, "active again")
    assert machine.unit("MainPID") != pid
    machine.sh("rm", "-r", "/etc/systemd/system/scheduledeventsd.service.d")
    machine.sh("systemctl", "daemon-reload")


def test_systemd_analyze_verify_prints_nothing(machine):
    result = machine.sh(
        "systemd-analyze", "verify", "/lib/systemd/system/scheduledeventsd.service", check=False
    )
    assert result.returncode == 0
    assert (result.stdout + result.stderr).strip() == ""


def _exposure(machine: Machine, unit: str) -> float:
    out = machine.sh("systemd-analyze", "security", "--no-pager", unit, check=False).stdout
    match = re.search(rf"Overall exposure level for {re.escape(unit)}: ([0-9.]+)", out)
    assert match, out[-500:]
    return float(match.group(1))


def test_the_hardening_lines_lower_the_exposure_systemd_analyze_reports(machine):
    unit = machine.sh("cat", "/lib/systemd/system/scheduledeventsd.service").stdout
    bare = unit.split("# --- Hardening")[0] + "\n[Install]\nWantedBy=multi-user.target\n"
    machine.sh("sh", "-c", f"cat > /etc/systemd/system/unhardened.service <<'EOF'\n{bare}EOF")
    machine.sh("systemctl", "daemon-reload")
    before = _exposure(machine, "unhardened.service")
    after = _exposure(machine, "scheduledeventsd.service")
    machine.sh("rm", "/etc/systemd/system/unhardened.service")
    machine.sh("systemctl", "daemon-reload")
    release = machine.sh("sh", "-c", ". /etc/os-release; echo $VERSION_CODENAME").stdout.strip()
    report = ROOT / "build" / f"systemd-analyze-security-{release}.txt"
    report.parent.mkdir(exist_ok=True)
    report.write_text(f"without hardening: {before}\nas shipped: {after}\n")
    assert after < before - 2, f"{before} -> {after}"
    security = (ROOT / "docs/explanation/security.md").read_text()  # the figures the docs state
    tests_page = (ROOT / "docs/contributing/tests.md").read_text()
    assert f"| as shipped | {after:.1f} " in security
    assert f"{before:.1f} without the hardening lines, {after:.1f} as shipped" in tests_page


def test_the_same_package_and_hooks_serve_aws_under_real_systemd(machine):
    """provider: aws, its simulator on 169.254.169.254:81 inside the machine (bound by a thread of
    this process that entered the machine's network): a scheduled reboot runs the shipped drain
    and checkpoint, nothing is posted, and its completion the undrain."""
    ec2 = AwsSimulator(instance_id="i-0deployed0000001")
    in_netns(f"/proc/{machine.pid}/ns/net", lambda: ec2.start("169.254.169.254", 81))
    config = "/etc/scheduledeventsd/config.yaml"
    text = machine.sh("cat", config).stdout
    try:
        machine.sh(
            "sh",
            "-c",
            f"printf 'provider: aws\\nmetadata:\\n  url: http://169.254.169.254:81\\n' > {config}",
        )
        machine.sh("systemctl", "restart", "scheduledeventsd")
        wait_for(lambda: machine.unit("ActiveState") == "active", 30, "the service on AWS")
        event_id = ec2.schedule("system-reboot", in_seconds=3600)
        wait_for(
            lambda: machine.journal(f"EVENT_ID={event_id}", "LOG_EVENT=approval_skipped"),
            30,
            "the reboot prepared and left to AWS",
        )
        records = machine.journal(f"EVENT_ID={event_id}")
        hooks_run = [r["HOOK"] for r in records if r["LOG_EVENT"] == "hook_finished"]
        assert hooks_run == ["drain", "checkpoint"]
        assert {r["RESOURCES"] for r in records if "RESOURCES" in r} == {ec2.instance_id}
        ec2.set_state(event_id, "completed")
        wait_for(
            lambda: machine.journal(f"EVENT_ID={event_id}", "LOG_EVENT=after_hooks_finished"),
            30,
            "the undrain once AWS marked it completed",
        )
        assert ec2.tokens_issued >= 1, "IMDSv2: a session token first"
        assert not [r for r in ec2.requests if r.method not in ("GET", "PUT")]
    finally:
        machine.sh("sh", "-c", f"cat > {config} <<'EOF'\n{text}EOF")
        machine.sh("systemctl", "restart", "scheduledeventsd")
        ec2.stop()


def test_purge_leaves_nothing_behind(machine):
    machine.sh("dpkg", "--purge", "scheduledeventsd")
    assert machine.unit("ActiveState") in ("inactive", "")
    # /var/cache/man is man-db's page cache (filled by `systemd-analyze verify` calling man),
    # which man-db expires itself; /root holds the .deb that was installed.
    find = "find / -xdev -name '*scheduledeventsd*' ! -path '/root/*' ! -path '/var/cache/man/*'"
    leftovers = machine.sh("sh", "-c", f"{find} 2>/dev/null", check=False).stdout.split()
    assert leftovers == []
