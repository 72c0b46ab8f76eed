"""Metrics, /health, /status, the status command and webhooks, on a real daemon process: scraped
over HTTP and parsed with prometheus_client's parser, webhooks received by real HTTP servers
(one failing, one hanging, one down)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from scheduledeventsd import __version__
from tests.conftest import VM, cli, wait_for
from tests.etcd_cluster import free_ports

SESSION = requests.Session()
SESSION.trust_env = False


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = SESSION.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples, name, **labels):
    return samples[(name, tuple(sorted(labels.items())))]


def health(port: int, host: str = "127.0.0.1") -> tuple[int, str]:
    answer = SESSION.get(f"http://{host}:{port}/health", timeout=5)
    return answer.status_code, answer.text


def observed(daemons, hooks, port, **extra):
    """A daemon serving HTTP on `port`, with a slow drain and an undrain after-hook."""
    cfg = daemons.config(
        vm_name=VM,
        http={"listen": f"127.0.0.1:{port}"},
        hooks={
            "drain": [{"command": [hooks.recorder("drain", "sleep 1")]}],
            "undrain": [{"command": [hooks.make("undrain", 'sleep 0.5; touch "$OUT/undrained"')]}],
            "broken": [{"command": [hooks.make("broken", "exit 3")]}],
        },
        events={"Reboot": {"before": ["drain"], "after": ["undrain"]}, "Freeze": ["broken"]},
        **extra,
    )
    return daemons.start(cfg)


def test_metrics_are_zero_initialised_and_count_an_event_through_its_life(daemons, hooks, sim):
    (port,) = free_ports(1)
    daemon = observed(daemons, hooks, port)
    daemon.polls_seen(sim)
    before = scrape(port)
    assert value(before, "scheduledeventsd_approvals_total", result="error") == 0
    assert value(before, "scheduledeventsd_approvals_total", result="ok") == 0
    zero = {"hook": "drain", "stage": "before", "result": "timeout"}
    assert value(before, "scheduledeventsd_hook_runs_total", **zero) == 0
    assert value(before, "scheduledeventsd_poll_errors_total", kind="http_429") == 0
    assert value(before, "scheduledeventsd_events_pending", type="Reboot") == 0
    assert value(before, "scheduledeventsd_next_event_not_before_timestamp_seconds") == 0
    assert value(before, "scheduledeventsd_info", version="0.1.0", vm_name=VM) == 1
    assert value(before, "scheduledeventsd_polls_total", result="ok") >= 3
    last_ok = value(before, "scheduledeventsd_last_successful_poll_timestamp_seconds")
    assert time.time() - 60 < last_ok <= time.time(), "a recent poll's wall time, not 0"

    sim.add_event("Reboot", ["another-vm"])
    event_id = sim.add_event("Reboot", [VM], not_before_in=600)
    daemon.wait_log("hook_started", hook="drain")
    during = scrape(port)
    assert value(during, "scheduledeventsd_events_pending", type="Reboot") == 1
    not_before = value(during, "scheduledeventsd_next_event_not_before_timestamp_seconds")
    assert abs(not_before - (time.time() + 600)) < 60, "the event's NotBefore, not 0"
    assert value(during, "scheduledeventsd_document_incarnation") == sim.incarnation

    daemon.wait_log("after_hooks_finished", event_id=event_id, timeout=15)
    after = scrape(port)
    assert value(after, "scheduledeventsd_events_seen_total", type="Reboot", ours="true") == 1
    assert value(after, "scheduledeventsd_events_seen_total", type="Reboot", ours="false") == 1
    ok = {"stage": "before", "result": "ok"}
    assert value(after, "scheduledeventsd_hook_runs_total", hook="drain", **ok) == 1
    done = {"hook": "undrain", "stage": "after", "result": "ok"}
    assert value(after, "scheduledeventsd_hook_runs_total", **done) == 1
    duration = value(
        after, "scheduledeventsd_hook_duration_seconds_sum", hook="drain", stage="before"
    )
    assert 1 <= duration < 60, "the drain's own second, not 0"
    assert value(after, "scheduledeventsd_approvals_total", result="ok") == 1
    assert value(after, "scheduledeventsd_detection_to_approval_seconds_count") == 1
    assert 1 <= value(after, "scheduledeventsd_detection_to_approval_seconds_sum") < 60
    assert value(after, "scheduledeventsd_events_pending", type="Reboot") == 0
    assert value(after, "scheduledeventsd_next_event_not_before_timestamp_seconds") == 0


def test_health_turns_503_at_detection_and_200_once_the_after_hooks_are_done(daemons, hooks, sim):
    (port,) = free_ports(1)
    observed(daemons, hooks, port)
    seen: list[tuple[float, int, str]] = []
    stop = threading.Event()

    def probe() -> None:  # what an Azure Load Balancer does, every 50 ms here
        while not stop.is_set():
            code, text = health(port)
            seen.append((time.time(), code, text))
            time.sleep(0.05)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    time.sleep(0.3)
    added = time.time()
    event_id = sim.add_event("Reboot", [VM], not_before_in=600)
    wait_for((hooks.out / "undrained").exists, 15, "the after-hook to end")
    wait_for(lambda: seen[-1][1] == 200 and seen[-1][0] > added + 1, 10, "200 again")
    stop.set()
    prober.join()
    codes = [code for _, code, _ in seen]
    runs = [codes[0]] + [c for prev, c in zip(codes, codes[1:]) if c != prev]
    assert runs == [200, 503, 200], runs
    first_503 = next(t for t, c, _ in seen if c == 503)
    drained = (hooks.out / "drain.env").stat().st_mtime  # the drain starts as it is detected
    assert first_503 < drained + 1.0, "out of rotation while it drains, not after its 1 s"
    assert any(text == f"maintenance: Reboot {event_id}\n" for _, c, text in seen if c == 503)
    back = next(t for t, c, _ in seen if t > first_503 and c == 200)
    undrained = (hooks.out / "undrained").stat().st_mtime
    assert back >= undrained, "back in rotation only once the after-hooks ended"


def test_health_from_hooks_done_stays_200_while_the_drain_runs(daemons, hooks, sim):
    (port,) = free_ports(1)
    daemon = observed(daemons, hooks, port, health={"unhealthy_from": "hooks_done"})
    sim.add_event("Reboot", [VM], not_before_in=600)
    daemon.wait_log("hook_started", hook="drain")
    assert health(port)[0] == 200
    daemon.wait_log("hook_finished", hook="drain")
    wait_for(lambda: health(port)[0] == 503, 5, "503 once the drain is done")


def _non_loopback_address() -> str:
    """An address of this machine that is not loopback (CI machines have eth0)."""
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "scope", "global"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    addresses = [out[i + 1].split("/")[0] for i, word in enumerate(out) if word == "inet"]
    assert addresses, "no non-loopback IPv4 address on this machine"
    return addresses[0]


def test_other_hosts_get_only_health(daemons, hooks, sim):
    (port,) = free_ports(1)
    cfg = daemons.config(vm_name=VM, http={"listen": f"0.0.0.0:{port}"})
    daemons.start(cfg)
    outside = _non_loopback_address()
    # Bound to the non-loopback address, so the daemon sees a non-loopback client.
    remote = requests.Session()
    remote.trust_env = False
    remote.mount("http://", _SourceAdapter(outside))
    assert remote.get(f"http://{outside}:{port}/health", timeout=5).status_code == 200
    assert remote.get(f"http://{outside}:{port}/metrics", timeout=5).status_code == 404
    assert remote.get(f"http://{outside}:{port}/status", timeout=5).status_code == 404
    assert SESSION.get(f"http://127.0.0.1:{port}/metrics", timeout=5).status_code == 200
    assert SESSION.get(f"http://127.0.0.1:{port}/status", timeout=5).json()["vm_name"] == VM


class _SourceAdapter(requests.adapters.HTTPAdapter):
    def __init__(self, source: str) -> None:
        self.source = source
        super().__init__()

    def init_poolmanager(self, *args, **kwargs):
        kwargs["source_address"] = (self.source, 0)
        super().init_poolmanager(*args, **kwargs)


def test_the_metrics_textfile_is_written_for_node_exporter(daemons, hooks, sim, tmp_path):
    textfile = tmp_path / "collector" / "scheduledeventsd.prom"
    textfile.parent.mkdir()
    cfg = daemons.config(vm_name=VM, metrics_textfile=str(textfile), events={"Freeze": []})
    daemon = daemons.start(cfg)
    wait_for(textfile.exists, 5, "the textfile")
    sim.add_event("Freeze", [VM])
    daemon.wait_log("event_approved")
    wait_for(lambda: 'scheduledeventsd_approvals_total{result="ok"} 1.0' in textfile.read_text(), 5)
    names = {f.name for f in text_string_to_metric_families(textfile.read_text())}
    assert "scheduledeventsd_info" in names
    assert [p.name for p in textfile.parent.iterdir()] == ["scheduledeventsd.prom"], "no temp left"


UNIT_UMASK = ("sh", "-c", 'umask 077 && exec "$@"', "sh")  # the unit's UMask=0077


@pytest.fixture
def node_exporter_dir():
    """A textfile directory as Debian ships it: owned by `prometheus`, readable by all (and
    outside pytest's 0700 root-only temp tree, so node_exporter's user can read it)."""
    import pwd  # noqa: PLC0415
    import shutil  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    user = pwd.getpwnam("prometheus")
    path = Path(tempfile.mkdtemp(prefix="scheduledeventsd-textfile-", dir="/tmp"))
    os.chown(path, user.pw_uid, user.pw_gid)
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_debians_node_exporter_running_as_prometheus_serves_the_daemons_metrics(
    daemons, sim, node_exporter_dir
):
    """The unit's UMask=0077 made the textfile 0600 root, which node_exporter's user cannot
    read; and the daemon's own process_* families clashed with node_exporter's ("collected
    before"): its metrics never arrived."""
    textfile = node_exporter_dir / "scheduledeventsd.prom"
    cfg = daemons.config(vm_name=VM, metrics_textfile=str(textfile))
    daemons.start(cfg, prefix=UNIT_UMASK)
    wait_for(textfile.exists, 10, "the textfile")
    assert textfile.stat().st_mode & 0o777 == 0o644
    (port,) = free_ports(1)
    exporter = subprocess.Popen(
        [
            "setpriv", "--reuid=prometheus", "--regid=prometheus", "--init-groups",
            "--pdeathsig", "KILL", "/usr/bin/prometheus-node-exporter",
            f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults",
            "--collector.textfile", f"--collector.textfile.directory={node_exporter_dir}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}/metrics"

        def scraped():
            try:
                return requests.get(url, timeout=5).text
            except requests.ConnectionError:
                return None

        text = wait_for(scraped, 15, "node_exporter")
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert f'scheduledeventsd_info{{version="0.1.0",vm_name="{VM}"}} 1' in text
        (error,) = families["node_textfile_scrape_error"].samples
        assert error.value == 0
        assert "scheduledeventsd_polls" in families
    finally:
        exporter.kill()
        _, stderr = exporter.communicate(timeout=10)
    assert "collected before" not in stderr, stderr[-2000:]


def test_a_symlink_planted_in_the_textfile_directory_redirects_no_write(node_exporter_dir):
    """The directory's owner (node_exporter's `prometheus`) plants symlinks to a root-only file
    at the temporary name prometheus_client's writer used and reused every 30 s
    (PATH.<pid>.<thread>) and at the textfile itself: the daemon, root, writes through neither."""
    import threading  # noqa: PLC0415

    from scheduledeventsd.config import Config  # noqa: PLC0415
    from scheduledeventsd.observe.metrics import Metrics  # noqa: PLC0415

    textfile = node_exporter_dir / "scheduledeventsd.prom"
    precious = node_exporter_dir.parent / f"{node_exporter_dir.name}-precious"
    precious.write_text("root's own\n")
    precious.chmod(0o600)
    try:
        predictable = Path(f"{textfile}.{os.getpid()}.{threading.current_thread().ident}")
        predictable.symlink_to(precious)
        textfile.symlink_to(precious)
        Metrics(Config(hooks={}, events={})).write_textfile(str(textfile))
        assert precious.read_text() == "root's own\n"
        assert not textfile.is_symlink()
        assert "scheduledeventsd_info" in textfile.read_text()
        assert "process_cpu_seconds_total" not in textfile.read_text()
        leftovers = {p for p in node_exporter_dir.iterdir()} - {textfile, predictable}
        assert not leftovers, "no temp file left behind"
    finally:
        precious.unlink()


def test_a_thousand_slow_clients_keep_no_event_from_its_hooks_or_approval(daemons, hooks, sim):
    """200 half-open requests made 202 threads; with LimitNOFILE low, 80 idle connections made
    hooks fail to start (EMFILE) and the state save fail."""
    (port,) = free_ports(1)
    cfg = daemons.config(
        vm_name=VM,
        http={"listen": f"127.0.0.1:{port}"},
        hooks={"drain": [{"command": [hooks.recorder("drain", "sleep 0.5")]}]},
        events={"Reboot": ["drain"]},
    )
    daemon = daemons.start(cfg, prefix=("prlimit", "--nofile=128:128"))
    clients = []
    for _ in range(1000):  # all at once
        client = socket.socket()
        client.setblocking(False)
        client.connect_ex(("127.0.0.1", port))
        clients.append(client)
    stop = threading.Event()

    def trickle():  # half a request, then a byte every 2 s: within the 5 s of each read
        first = b"GET /health HTTP/1.1\r\nHost: "
        while not stop.is_set():
            for client in clients:
                with contextlib.suppress(OSError):
                    client.send(first or b"x")
            first = b""
            stop.wait(2)

    trickler = threading.Thread(target=trickle, daemon=True)
    trickler.start()
    try:
        time.sleep(3)  # they are established, and held wherever the server let them be
        event_id = sim.add_event("Reboot", [VM], not_before_in=600)
        daemon.wait_log("event_approved", event_id=event_id, timeout=60)
        assert hooks.order() == ["drain"]
    finally:
        stop.set()
        trickler.join(10)
        for client in clients:
            client.close()
    wait_for(lambda: health(port)[0] in (200, 503), 30, "/health answering again")
    assert "Too many open files" not in daemon.output()
    assert not daemon.logs("state_degraded")


def test_a_request_trickling_in_is_cut_at_its_deadline():
    """One byte every 4 s kept a connection, and its thread, for as long as the client liked."""
    from scheduledeventsd.config import Listen  # noqa: PLC0415
    from scheduledeventsd.observe import web  # noqa: PLC0415

    (port,) = free_ports(1)
    deadline = 2.0  # the daemon's is web.REQUEST_DEADLINE; the mechanism is the same
    server = web.WebServer(
        Listen("127.0.0.1", port),
        web.Answers(lambda: None, lambda: b"", "text/plain", lambda: {}),
        deadline=deadline,
    )
    server.start()
    try:
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        client.setblocking(False)  # to see the server's close without waiting for it
        started = time.monotonic()
        cut = None
        for byte in b"GET /health HTTP/1.1\r\nHost: a-slow-client\r\n":  # 50 s at this pace
            try:
                client.send(bytes([byte]))
                if client.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK) == b"":
                    cut = time.monotonic() - started
                    break
            except BlockingIOError:
                pass
            except OSError:
                cut = time.monotonic() - started
                break
            time.sleep(1.0)
        client.close()
        assert cut is not None, "the trickle was served to its end"
        assert deadline - 0.5 <= cut < 10 * deadline, cut  # not the 50 s of its trickle
    finally:
        server.stop()


# ---- status --------------------------------------------------------------------------------


def test_status_shows_the_events_and_exits_1_when_a_hook_failed_on_a_pending_one(
    daemons, hooks, sim
):
    (port,) = free_ports(1)
    daemon = observed(daemons, hooks, port)
    healthy = cli("status", "--config", str(daemon.config_path))
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert "health: ok" in healthy.stdout
    event_id = sim.add_event("Freeze", [VM], not_before_in=600)
    daemon.wait_log("event_not_approved", event_id=event_id)
    raw = yaml.safe_load(daemon.config_path.read_text())
    without_http = daemons.write_config({k: v for k, v in raw.items() if k != "http"}, "file.yaml")
    for path in (daemon.config_path, without_http):  # from /status, then from status.json
        shown = cli("status", "--config", str(path), "--json")
        assert shown.returncode == 1, shown.stdout + shown.stderr
        doc = json.loads(shown.stdout)
        (event,) = doc["events"]
        assert event["event_id"] == event_id
        assert event["phase"] == "hooks_failed"
        assert event["hooks"] == [
            {
                "hook": "broken",
                "stage": "before",
                "result": "failed",
                "duration_s": pytest.approx(0, abs=1),
            }
        ]
        assert event["detected_at"]
        assert 0 < event["seconds_to_not_before"] <= 600
        assert any("a hook failed for Freeze" in p for p in doc["problems"])
    text = cli("status", "--config", str(daemon.config_path))
    assert "PROBLEM: a hook failed for Freeze" in text.stdout
    assert f"Freeze {event_id}: hooks_failed" in text.stdout


def test_status_without_a_daemon_says_so_and_exits_1(daemons, tmp_path):
    path = daemons.write_config(daemons.config(vm_name=VM))
    shown = cli("status", "--config", str(path))
    assert shown.returncode == 1
    assert "no status" in shown.stderr
    assert "is the daemon running?" in shown.stderr


def test_status_of_a_stopped_daemon_shows_its_last_file_as_stopped(daemons, sim, tmp_path):
    """status.json stays when the daemon stops: `status` said "health: ok", exit 0; then it
    said nothing at all. It shows what the stopped daemon last knew, flagged, and exits 1."""
    cfg = daemons.config(vm_name=VM)
    daemon = daemons.start(cfg)
    wait_for((daemons.state_dir / "status.json").exists, what="status.json")
    path = daemons.write_config(cfg)
    running = cli("status", "--config", str(path))
    assert running.returncode == 0, running.stdout + running.stderr
    assert daemon.stop() == 0
    stopped = cli("status", "--config", str(path))
    assert stopped.returncode == 1
    assert "is from a stopped one; is the daemon running?" in stopped.stderr
    assert f"scheduledeventsd {__version__} on {VM}" in stopped.stdout
    assert "PROBLEM: no daemon is running: no daemon holds" in stopped.stdout
    as_json = json.loads(cli("status", "--json", "--config", str(path)).stdout)
    assert as_json["vm_name"] == VM
    assert as_json["problems"][0].startswith("no daemon is running")
    again = daemons.start(cfg)  # and looking did not take the lock from a daemon starting
    assert again.proc.poll() is None


# ---- webhooks --------------------------------------------------------------------------------


class Receiver:
    """A real HTTP server that records what it is sent; `answers` scripts its replies."""

    def __init__(self, answers=(), hang: float = 0.0) -> None:
        self.got: list[tuple[float, int, dict]] = []
        self.answers = list(answers)
        self.hang = hang
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if receiver.hang:
                    time.sleep(receiver.hang)
                code = receiver.answers.pop(0) if receiver.answers else 200
                receiver.got.append((time.time(), code, body, dict(self.headers)))
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook/SECRET"

    def bodies(self, code=None):
        return [b for _, c, b, _ in self.got if code is None or c == code]

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receivers():
    made = []

    def make(*args, **kwargs):
        made.append(Receiver(*args, **kwargs))
        return made[-1]

    yield make
    for r in made:
        r.stop()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_webhooks_tell_each_step_and_a_failing_receiver_gets_it_once_after_retries(
    daemons, hooks, sim, receivers
):
    chat = receivers()
    flaky = receivers(answers=[500, 500, 500])
    cfg = daemons.config(
        vm_name=VM,
        hooks={"drain": [{"command": [hooks.recorder("drain")]}]},
        events={"Reboot": ["drain"]},
        webhooks=[
            {"url": chat.url, "format": "text", "headers": {"Authorization": "Bearer t0ken"}},
            {"url": flaky.url, "on": ["detected"], "retries": 5},
        ],
    )
    daemon = daemons.start(cfg)
    event_id = sim.add_event("Reboot", [VM], not_before_in=600)
    wait_for(lambda: len(chat.bodies()) >= 3, 15, "detected, approved, completed")
    texts = [b["text"] for b in chat.bodies()]
    assert texts[0] == (
        f"scheduledeventsd on {VM}: Reboot {event_id} detected, NotBefore "
        f"{daemon.logs('event_detected')[0]['not_before']}"
    )
    assert texts[1].startswith(f"scheduledeventsd on {VM}: Reboot {event_id} approved")
    assert texts[2].startswith(f"scheduledeventsd on {VM}: Reboot {event_id} over")
    assert chat.got[0][3]["Authorization"] == "Bearer t0ken"
    wait_for(lambda: flaky.bodies(200), 10, "the flaky receiver's success")
    assert [c for _, c, _, _ in flaky.got] == [500, 500, 500, 200]
    (delivered,) = flaky.bodies(200)
    assert delivered["what"] == "detected"
    assert delivered["event"]["event_id"] == event_id
    assert delivered["vm_name"] == VM
    logged = daemon.wait_log(
        "webhook_delivered", what="detected", url=flaky.url.split("/hook")[0] + "/..."
    )
    assert "SECRET" not in json.dumps(daemon.records), "the URL's path (a secret) is never logged"
    assert logged["status"] == 200


def test_a_failed_webhooks_error_names_no_secret(daemons, hooks, sim):
    """requests' error text carries the whole URL: the path of a Slack or Teams URL is its
    secret, and it reached the log through `error`, past the host-only `url` field."""
    secret = "T000/B000/XXXXSECRETXXXX"  # noqa: S105 - a made-up one, to look for in the log
    down = f"http://127.0.0.1:{_closed_port()}/services/{secret}?token=QUERYSECRET"
    cfg = daemons.config(
        vm_name=VM,
        hooks={"drain": [{"command": [hooks.recorder("drain")]}]},
        events={"Reboot": ["drain"]},
        webhooks=[{"url": down, "timeout": 1, "retries": 0, "headers": {"X-Key": "HEADERSECRET"}}],
    )
    daemon = daemons.start(cfg)
    sim.add_event("Reboot", [VM], not_before_in=600)
    failed = daemon.wait_log("webhook_failed", timeout=15)
    assert "refused" in failed["error"] or "Max retries" in failed["error"]
    text = daemon.output()
    for leaked in ("SECRET", "services/T000"):
        assert leaked not in text, f"{leaked} in the log"


def test_a_hanging_or_absent_receiver_delays_nothing(daemons, hooks, sim, receivers):
    hanging = receivers(hang=30)
    down = f"http://127.0.0.1:{_closed_port()}/hook"
    cfg = daemons.config(
        vm_name=VM,
        hooks={"drain": [{"command": [hooks.recorder("drain")]}]},
        events={"Reboot": ["drain"]},
        webhooks=[
            {"url": hanging.url, "timeout": 1, "retries": 1},
            {"url": down, "timeout": 1, "retries": 2},
        ],
    )
    daemon = daemons.start(cfg)
    sim.add_event("Reboot", [VM], not_before_in=600)
    finished = daemon.wait_log("hook_finished", hook="drain")
    approved = daemon.wait_log("event_approved", timeout=30)
    assert sim.approvals, "approved while both receivers fail"
    failed = daemon.wait_log("webhook_failed", url=down.rsplit("/", 1)[0] + "/...", timeout=15)
    assert "Max retries exceeded" in failed["error"] or "refused" in failed["error"]
    stuck = daemon.wait_log(
        "webhook_failed", url=hanging.url.split("/hook")[0] + "/...", timeout=20
    )
    # Order, not speed: approved before the hanging receiver had even been given up on.
    assert daemon.records.index(approved) < daemon.records.index(stuck)
    assert finished  # polling went on meanwhile:
    daemon.polls_seen(sim, count=4)


def test_dry_run_opens_no_port_writes_no_file_and_sends_no_webhook(
    daemons, hooks, sim, receivers, tmp_path
):
    (port,) = free_ports(1)
    chat = receivers()
    textfile = tmp_path / "dry.prom"
    cfg = daemons.config(
        vm_name=VM,
        http={"listen": f"127.0.0.1:{port}"},
        metrics_textfile=str(textfile),
        events={"Freeze": []},
        webhooks=[{"url": chat.url}],
    )
    daemon = daemons.start(cfg, args=("--dry-run",))
    event_id = sim.add_event("Freeze", [VM])
    daemon.wait_log("would_send_webhook", what="approved", event_id=event_id)
    daemon.polls_seen(sim)
    assert chat.got == []
    assert not textfile.exists()
    assert not (daemons.state_dir / "status.json").exists()
    with pytest.raises(requests.ConnectionError):
        SESSION.get(f"http://127.0.0.1:{port}/health", timeout=2)
