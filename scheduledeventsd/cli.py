"""Command line: parse arguments, call the module that does the work, map errors to exit codes."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from . import __version__, config
from .config import loader
from .host.store import STATUS_FILE, daemon_running, unsafe_state_dir
from .model import EVENT_TYPES
from .observe import fleet as fleet_view
from .observe import observer, report, status_doc
from .plan.fleet import out_of_range, parse_instant
from .plan.scenarios import SCENARIOS
from .providers.identity import resolve
from .providers.imds import ImdsError
from .runtime import log
from .runtime.daemon import Daemon, run_daemon
from .runtime.rehearsal import rehearse
from .runtime.wiring import client_for

if TYPE_CHECKING:  # the simulators stay out of the daemon's memory
    from .simulators.serving import Serving

EXIT_CONFIG = 2
SHIPPED_HOOKS = "/etc/scheduledeventsd/hooks"
SHIPPED_HOOKS_HINT = (
    f"hint: {SHIPPED_HOOKS}/ is where the package installs the example hooks; from a clone, "
    "install the package, or point the hooks at files of your own (the tutorial: docs/tutorial.md)"
)
PROVIDERS = ("azure", "aws", "gcp")


def _add_config(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        type=Path,
        default=loader.DEFAULT_PATH,
        metavar="PATH",
        help="the configuration file (default: %(default)s)",
    )


def _add_logging(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log-target",
        choices=("auto", "console", "journal"),
        default="auto",
        help="auto: journald when started by systemd, else the console",
    )
    p.add_argument(
        "--log-format", choices=("console", "json"), default="console", help="on the console"
    )
    p.add_argument("--log-level", choices=log.LEVELS, default="info", help="the least logged")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="scheduledeventsd",
        description="Prepare this VM for maintenance announced by Azure, AWS or Google Cloud: "
        "run the hooks configured for each notice, then (on Azure) approve it.",
    )
    top.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = top.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser(
        "run",
        help="run the daemon in the foreground (what systemd runs)",
        description="Run the daemon in the foreground; this is what the systemd unit starts. "
        "SIGTERM or SIGINT stop it after running hooks finish (at most shutdown_grace seconds); "
        "SIGHUP reloads the configuration and keeps the old one if the new one is invalid.",
    )
    _add_config(p)
    _add_logging(p)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="log every decision, run no hook, post no approval, write no state, take no lock",
    )

    p = sub.add_parser(
        "check-config",
        help="validate the configuration and summarise it",
        description="Validate the configuration and print what was read, one line per section, "
        "also for a section left unset: the provider and why it was chosen, the endpoint, the "
        "events and hooks, the windows, concurrency, coordination (etcd or the gate), the "
        "Pacemaker cluster, the HTTP endpoint, health and each webhook (by its host). It refuses "
        "what run refuses, a config file or a state directory another user owns or group or "
        "others can write included. Exit status 0 if valid, 2 if not, with every problem named "
        "by file and key path.",
    )
    _add_config(p)
    p.add_argument(
        "--quiet", action="store_true", help="print only problems (as the unit's ExecStartPre)"
    )

    p = sub.add_parser(
        "events",
        help="query IMDS once and show the scheduled events",
        description="Query IMDS once and show the events: whether each affects this VM, its "
        "type, status, NotBefore in local time and a countdown. Exit 1 if IMDS could not be "
        "queried.",
    )
    _add_config(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser(
        "status",
        help="what the daemon on this machine knows, without asking IMDS; exit 1 if unhealthy",
        description="What the daemon on this machine knows, without asking IMDS: the last poll, "
        "each event of this VM with its phase, hook results, times and a countdown to NotBefore. "
        "From /status when http.listen is set, else from status.json in the state directory. "
        "Exit 0 if healthy; 1 if IMDS has been unreachable for over 5 minutes, a hook failed on "
        "an event still pending, on a Pacemaker node (cluster.pacemaker) the cluster cannot drain "
        "this node (shown as cluster_unready, read at start and every minute) or a mark the "
        "daemon set fails to come off, the status is over 5 minutes old, or no daemon is "
        "running (then the stopped daemon's last status is shown, flagged).",
    )
    _add_config(p)
    p.add_argument("--json", action="store_true", help="the status document as JSON")

    fleet_view.add_parser(sub, _add_config)

    p = sub.add_parser(
        "test-hooks",
        help="run the hooks of one stage for a synthetic event (a rehearsal)",
        description="Run the configured hooks of one stage for a synthetic event of that type "
        "naming this VM, with the environment and standard input a real event gets; print their "
        "output. Exit 0 if all succeeded, 1 if one failed, 2 if none are configured. No IMDS "
        "call, no state.",
    )
    p.add_argument(
        "event_type", metavar="EVENT_TYPE", choices=EVENT_TYPES, help="the event to rehearse"
    )
    p.add_argument("--stage", choices=config.STAGES, default="before", help="whose hooks run")
    _add_config(p)

    p = sub.add_parser(
        "simulate",
        help="run the built-in IMDS simulator",
        description="Run the built-in IMDS simulator, for testing hooks and configurations: "
        "Azure's Scheduled Events, or with --provider aws or gcp that cloud's metadata service, "
        "playing a sequence of its notices.",
    )
    p.add_argument(
        "--listen", default="127.0.0.1:8080", metavar="HOST:PORT", help="where to answer"
    )
    p.add_argument(
        "--provider",
        choices=PROVIDERS,
        default="azure",
        help="whose metadata service (aws, gcp: playing a built-in sequence of notices)",
    )
    p.add_argument("--scenario", type=Path, metavar="FILE", help="scenario YAML to play")
    p.add_argument("--vm-name", metavar="NAME", help="VM name to answer (overrides the scenario's)")
    p.add_argument(
        "--no-rate-limit", action="store_true", help="do not answer 429 above 5 requests/s"
    )

    p = sub.add_parser(
        "plan",
        help="replay a maintenance wave over a fleet on the daemon's own engine",
        description="Replay the maintenance FLEET.yaml describes over its VMs, each running "
        "the daemon's own engine with its config on a simulated clock: when each VM's hooks "
        "start and what they waited for (window, slot, lead), when it is approved, down and "
        "back, its slot, and per group the most VMs in maintenance at once. Exit 0 if all is "
        "in time, 1 if a VM is late or a group exceeds its max, 2 for bad input (every problem "
        "named by file and key path).",
    )
    given = p.add_mutually_exclusive_group(required=True)
    given.add_argument("--fleet", type=Path, metavar="FILE", help="the fleet (YAML)")
    given.add_argument(
        "--scenario",
        choices=SCENARIOS,
        help="one VM and one event with Azure's timings, instead of a fleet",
    )
    p.add_argument(
        "--config",
        type=Path,
        default=loader.DEFAULT_PATH,
        metavar="PATH",
        help="the configuration of each VM whose entry names none (default: %(default)s)",
    )
    p.add_argument(
        "--from",
        dest="start",
        type=_instant,
        metavar="ISO8601",
        help="when the plan starts, UTC unless it names a zone (default: now)",
    )
    p.add_argument(
        "--format",
        choices=("text", "json", "svg"),
        default="text",
        help="a table, the rows and summary as JSON (for a pipeline), or a picture",
    )
    p.add_argument("--output", type=Path, metavar="FILE", help="default: standard output")

    p = sub.add_parser(
        "demo",
        help="the daemon against the simulator, playing a scenario",
        description="Run the daemon against the simulator playing a scenario.",
    )
    p.add_argument(
        "--scenario", type=Path, metavar="FILE", help="default: the bundled demo scenario"
    )
    p.add_argument("--provider", choices=PROVIDERS, default="azure", help="default: %(default)s")
    p.add_argument(
        "--hooks-dir",
        type=Path,
        default=Path("/etc/scheduledeventsd/hooks"),
        metavar="DIR",
        help="directory with drain, undrain, checkpoint and shutdown hooks (default: %(default)s)",
    )
    _add_logging(p)
    return top


def _instant(text: str) -> dt.datetime:
    """`plan --from`: an ISO 8601 instant the plan can run from (its year 9999 overflowed)."""
    try:
        parsed = parse_instant(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 instant: {text!r}") from None
    problem = out_of_range(parsed)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return parsed


def _load_config(path: Path) -> Optional[config.Config]:
    try:
        return loader.load(path)
    except config.ConfigError as e:
        for problem in e.problems:
            print(f"error: {problem}", file=sys.stderr)
        print(f"{path}: {len(e.problems)} problem(s); nothing was started", file=sys.stderr)
        if any(f"{SHIPPED_HOOKS}/" in p and "no such file" in p for p in e.problems):
            print(SHIPPED_HOOKS_HINT, file=sys.stderr)
        return None


def cmd_run(args: argparse.Namespace) -> int:
    warning = log.configure(args.log_target, args.log_format, args.log_level)
    cfg = _load_config(args.config)
    if cfg is None:
        return EXIT_CONFIG
    if warning:
        log.get().warning("journal_unavailable", reason=warning)
    for text in cfg.warnings:
        log.get().warning("config_warning", warning=text)
    return run_daemon(cfg, dry_run=args.dry_run)


def cmd_check_config(args: argparse.Namespace) -> int:
    cfg = _load_config(args.config)
    if cfg is None:
        return EXIT_CONFIG
    unsafe = unsafe_state_dir(cfg.state_dir, owners=(0,))
    if unsafe:  # what `run` would refuse, refused here too
        print(f"error: {args.config}: state_dir: {unsafe}", file=sys.stderr)
        print(f"{args.config}: 1 problem(s); nothing was started", file=sys.stderr)
        return EXIT_CONFIG
    for text in cfg.warnings:
        print(f"warning: {text}", file=sys.stderr)
    if args.quiet:
        return 0
    md = cfg.metadata
    print(f"{args.config}: OK")
    print(f"  provider:  {cfg.provider.value} ({cfg.provider_why})")
    query = f"?api-version={md.api_version}" if cfg.provider.can_approve else ""
    print(
        f"  metadata:  {md.url}{query} every {md.poll_interval:g}s "
        f"(timeout {md.timeout:g}s, first call {md.first_call_timeout:g}s)"
    )
    print(f"  VM name:   {cfg.vm_name or 'auto (from IMDS)'}")
    print(f"  approve:   {cfg.approve.value}")
    print(f"  users:     {cfg.user_events.value} (user_events)")
    print(f"  state:     {cfg.state_dir}")
    for event_type, rule in cfg.events.items():
        chain = " -> ".join(rule.before) if rule.before else "(no hooks; approve at once)"
        extra = [
            f"{stage}: {' -> '.join(names)}"
            for stage, names in (("after", rule.after), ("cancelled", rule.cancelled))
            if names
        ]
        if rule.approve is not None:
            extra.append(f"approve: {rule.approve.value}")
        if rule.start_before is not None:
            extra.append(f"start_before: {rule.start_before:g}s")
        if rule.short_seconds is not None:
            extra.append(f"short_seconds: {rule.short_seconds}")
        print(f"  {event_type + ':':<10} {chain}" + (f"  ({'; '.join(extra)})" if extra else ""))
    for hook in cfg.hooks.values():
        for cmd in hook.commands:
            print(f"  hook {hook.name}: {' '.join(cmd.argv)} (timeout {cmd.timeout:g}s)")
    for line in report.sections(cfg):
        print(f"  {line}")
    return 0


def cmd_events(args: argparse.Namespace) -> int:
    cfg = _load_config(args.config)
    if cfg is None:
        return EXIT_CONFIG
    md = cfg.metadata
    client = client_for(cfg)
    try:
        identity = resolve(cfg.vm_name, client)
        doc = client.fetch_document()
    except ImdsError as e:
        print(f"error: {md.url}: {e}", file=sys.stderr)
        return 1
    finally:
        client.close()
    if identity.source == "hostname":
        print(
            f"warning: IMDS did not give the VM name ({identity.problem}); using the hostname",
            file=sys.stderr,
        )
    if args.json:
        print(report.as_json(doc, identity.name, cfg, dt.datetime.now(dt.timezone.utc)))
    else:
        print(report.table(doc, identity.name, dt.datetime.now(dt.timezone.utc), cfg))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """From /status when http.listen is set (fresh), else the daemon's status.json."""
    cfg = _load_config(args.config)
    if cfg is None:
        return EXIT_CONFIG
    doc, problem = _status_document(cfg)
    if doc is None:
        print(f"error: no status: {problem}; is the daemon running?", file=sys.stderr)
        return 1
    now = time.time()
    found = observer.problems(doc, now)
    if problem:  # a stopped daemon's last status: what it left (a slot, a mark) still matters
        print(f"error: {problem}; is the daemon running?", file=sys.stderr)
        found.insert(0, f"no daemon is running: {problem}")
    if args.json:
        print(json.dumps(dict(doc, problems=found), indent=2))
    else:
        print(report.status(doc, now, found))
    return 1 if found else 0


def _status_document(cfg: config.Config) -> tuple[Optional[status_doc.StatusDocument], str]:
    """The status (its shape checked as it comes in) and, for a daemon that stopped, why it
    is only its last one (else "")."""
    problems = []
    if cfg.listen is not None:
        host = cfg.listen.host
        if not cfg.listen.loopback:
            host = "::1" if ":" in host else "127.0.0.1"
        url = f"http://{f'[{host}]' if ':' in host else host}:{cfg.listen.port}/status"
        import requests  # noqa: PLC0415 - `status` only: the daemon's memory stays without it

        try:
            return status_doc.checked(_fetch_status(url)), ""
        except (requests.RequestException, ValueError, OSError) as e:
            problems.append(f"{url}: {e}")
    try:
        doc = status_doc.read(cfg.state_dir)
    except (OSError, ValueError) as e:
        problems.append(f"{cfg.state_dir / STATUS_FILE}: {e}")
        return None, "; ".join(problems)
    if daemon_running(cfg.state_dir) is False:  # the file outlives the daemon that wrote it
        return doc, f"no daemon holds {cfg.state_dir / 'lock'}; {STATUS_FILE} is from a stopped one"
    return doc, ""


STATUS_TIMEOUT = 3.0  # seconds for all of one GET of /status
MAX_STATUS = 16 << 20  # bytes of /status read at most: a real one is a few KiB


def _fetch_status(url: str) -> object:
    """The daemon's /status, within one deadline for all of it and at most MAX_STATUS bytes
    (whatever answers on that port: a reply that never ends is cut, not read to the end)."""
    import requests  # noqa: PLC0415

    from .host.deadline import Watch  # noqa: PLC0415
    from .host.watched import WatchedAdapter, read_at_most  # noqa: PLC0415

    adapter = WatchedAdapter()
    with requests.Session() as session, Watch(STATUS_TIMEOUT) as watch:
        session.trust_env = False
        session.mount("http://", adapter)
        adapter.watch = watch
        try:
            answer = session.get(
                url,
                timeout=watch.left(),
                allow_redirects=False,
                stream=True,
                headers={"Accept-Encoding": "identity"},
            )
            answer.raise_for_status()
            body = read_at_most(answer, MAX_STATUS)
        except (requests.RequestException, OSError, ValueError) as e:
            if watch.expired:
                raise requests.Timeout(f"no whole answer within {STATUS_TIMEOUT:g}s") from None
            raise ValueError(str(e)) from None
    if watch.expired:
        raise requests.Timeout(f"no whole answer within {STATUS_TIMEOUT:g}s")
    if body is None:
        raise ValueError(f"an answer larger than {MAX_STATUS} bytes")
    return json.loads(body)


def cmd_fleet(args: argparse.Namespace) -> int:
    cfg = _load_config(args.config) if fleet_view.usage(args) else None
    return EXIT_CONFIG if cfg is None else fleet_view.run(cfg, args)


def cmd_test_hooks(args: argparse.Namespace) -> int:
    cfg = _load_config(args.config)
    if cfg is None:
        return EXIT_CONFIG
    return rehearse(cfg, args.event_type, args.stage, lambda line: print(line, flush=True))


def cmd_simulate(args: argparse.Namespace) -> int:
    # Imported only here: keeps the HTTP server out of the daemon's memory.
    from .simulators import azure as simulator  # noqa: PLC0415
    from .simulators.scenario import Scenario, ScenarioError, load_scenario  # noqa: PLC0415

    if args.provider != "azure":
        return _simulate_other_cloud(args)
    try:
        scenario = load_scenario(args.scenario) if args.scenario else Scenario()
    except ScenarioError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    if args.vm_name:
        scenario.vm_name = args.vm_name
    sim = simulator.Simulator(scenario, rate_limit=not args.no_rate_limit)
    return _serve(sim, args.listen, f"IMDS simulator for VM {scenario.vm_name} on", lambda: None)


def _serve(sim: Serving, listen: str, what: str, begin: Callable[[], None]) -> int:
    """A simulator on HOST:PORT until interrupted."""
    try:
        host, _, port_text = listen.rpartition(":")
        sim.start(host.strip("[]") or "127.0.0.1", int(port_text))
    except (OSError, ValueError) as e:
        print(f"error: cannot listen on {listen}: {e}", file=sys.stderr)
        return 1
    print(f"{what} {sim.url}", flush=True)
    begin()
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        sim.stop()


def _other_cloud(provider: str) -> tuple[Serving, list[tuple[float, str, Callable[[], object]]]]:
    """The simulator of AWS's or Google Cloud's metadata service and what it plays."""
    from .simulators import aws as aws_simulator  # noqa: PLC0415 - only when asked for
    from .simulators import gcp as gcp_simulator  # noqa: PLC0415 - only when asked for

    if provider == "aws":
        aws = aws_simulator.AwsSimulator()
        return aws, aws_simulator.demo_steps(aws)
    gcp = gcp_simulator.GcpSimulator()
    return gcp, gcp_simulator.demo_steps(gcp)


def _play(steps: list[tuple[float, str, Callable[[], object]]], *, say: bool) -> None:
    for at, what, do in steps:

        def step(what: str = what, do: Callable[[], object] = do) -> None:
            if say:
                print(f"simulator: {what}", file=sys.stderr, flush=True)
            do()

        timer = threading.Timer(at, step)
        timer.daemon = True
        timer.start()


def _simulate_other_cloud(args: argparse.Namespace) -> int:
    sim, steps = _other_cloud(args.provider)
    return _serve(sim, args.listen, f"{args.provider} metadata simulator on",
                  lambda: _play(steps, say=True))  # fmt: skip


def cmd_demo(args: argparse.Namespace) -> int:
    # Imported only here: keeps the HTTP server out of the daemon's memory.
    from .simulators import azure as simulator  # noqa: PLC0415
    from .simulators.scenario import ScenarioError, bundled_scenario, load_scenario  # noqa: PLC0415

    log.configure(args.log_target, args.log_format, args.log_level)
    if args.provider != "azure":
        sim, steps = _other_cloud(args.provider)
        sim.start()
        status = _demo(args, sim.url, 20.0, f"{args.provider} simulator at {sim.url}; playing "
                       "its notices", lambda: _play(steps, say=True))  # fmt: skip
        sim.stop()
        return status
    args.scenario = args.scenario or bundled_scenario("demo")
    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    azure = simulator.Simulator(scenario)
    azure.start()
    what = f"simulator at {azure.url} for VM {scenario.vm_name}; playing {args.scenario.name}"
    status = _demo(args, azure.url, scenario.duration or 20.0, what, lambda: None)
    azure.stop()
    print(
        "demo: approvals the simulator received: "
        + (", ".join(a.event_id for a in azure.approvals) or "none"),
        file=sys.stderr,
    )
    return status


def _demo(
    args: argparse.Namespace, url: str, seconds: float, what: str, begin: Callable[[], None]
) -> int:
    """The daemon against a simulator at `url` for `seconds`, with the example hooks."""
    hooks_dir = args.hooks_dir.resolve()
    with tempfile.TemporaryDirectory(prefix="scheduledeventsd-demo-") as state_dir:
        raw = {
            "provider": args.provider,
            "metadata": {"url": url, "first_call_timeout": 10},
            "state_dir": state_dir,
            "hooks": {h: [{"command": [str(hooks_dir / h)]}] for h in loader.DEFAULT_HOOKS},
        }
        try:
            cfg = loader.parse(raw, "demo configuration")
        except config.ConfigError as e:
            for problem in e.problems:
                print(f"error: {problem}", file=sys.stderr)
            return EXIT_CONFIG
        print(f"demo: {what} for {seconds:g}s with hooks from {hooks_dir}", file=sys.stderr,
              flush=True)  # fmt: skip
        begin()
        daemon = Daemon(cfg)
        daemon.install_signal_handlers()
        timer = threading.Timer(seconds, daemon.request_stop)
        timer.daemon = True
        timer.start()
        status = daemon.run()
        timer.cancel()
    return status


def cmd_plan(args: argparse.Namespace) -> int:
    from .plan import command  # noqa: PLC0415 - the planner stays out of the daemon's memory

    return command.main(
        args.fleet, args.scenario, args.config,
        start=args.start, form=args.format, output=args.output,
    )  # fmt: skip


COMMANDS = {
    "run": cmd_run,
    "check-config": cmd_check_config,
    "events": cmd_events,
    "status": cmd_status,
    "fleet": cmd_fleet,
    "test-hooks": cmd_test_hooks,
    "simulate": cmd_simulate,
    "demo": cmd_demo,
    "plan": cmd_plan,
}


def main(argv: Optional[list[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        code = COMMANDS[args.command](args)
        sys.stdout.flush()  # a reader gone away is found here, not at the interpreter's exit
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader stopped reading (`| head`, `| grep -q`): end quietly with the status a
        # command killed by SIGPIPE has, as cat and grep do, not with a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    return code
