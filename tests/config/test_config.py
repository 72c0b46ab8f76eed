"""Config: defaults, and every error named by file and key path, all at once, no traceback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scheduledeventsd import config
from scheduledeventsd.config import ConfigError, loader
from tests.conftest import cli

ROOT = Path(__file__).parents[2]


@pytest.fixture
def hook(tmp_path: Path) -> str:
    path = tmp_path / "hook"
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return str(path)


def load(tmp_path: Path, text: str) -> config.Config:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return loader.load(path)


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    return info.value.problems


def test_an_empty_file_gives_the_documented_defaults(tmp_path):
    cfg = loader.parse(None, "x", check_files=False)
    assert cfg.metadata.url == "http://169.254.169.254/metadata/scheduledevents"
    assert cfg.metadata.api_version == "2020-07-01"
    assert (cfg.metadata.poll_interval, cfg.metadata.timeout, cfg.metadata.first_call_timeout) == (
        1,
        5,
        150,
    )
    assert cfg.vm_name is None
    assert cfg.approve is config.ApprovePolicy.SOLE
    assert cfg.state_dir == Path("/var/lib/scheduledeventsd")
    assert cfg.events["Reboot"] == config.EventRule(
        ("drain", "checkpoint"), ("undrain",), ("undrain",)
    )
    assert cfg.hooks["drain"].commands[0].argv == ("/etc/scheduledeventsd/hooks/drain",)


def test_the_shipped_config_states_exactly_the_defaults(tmp_path):
    raw = loader.parse_yaml((ROOT / "etc/scheduledeventsd/config.yaml").read_text())
    shipped = loader.parse(
        {k: v for k, v in raw.items() if k != "hooks"}, "shipped", check_files=False
    )
    assert shipped == loader.parse(None, "defaults", check_files=False)
    commands = {name: [c["command"] for c in cmds] for name, cmds in raw["hooks"].items()}
    assert commands == {n: [list(h.commands[0].argv)] for n, h in loader.DEFAULT_HOOKS.items()}


def test_a_given_events_mapping_replaces_the_default_wholly(tmp_path, hook):
    cfg = load(tmp_path, f"hooks:\n  h:\n    - command: [{hook}]\nevents:\n  Preempt: [h]\n")
    assert dict(cfg.events) == {"Preempt": config.EventRule(("h",))}


def test_own_hooks_without_events_fail_check_config_instead_of_crashing_the_daemon(tmp_path, hook):
    """The default events name drain, checkpoint, undrain and shutdown: with only `ok` defined,
    the first event of this VM used to kill `run` with KeyError: 'drain', on every restart."""
    path = tmp_path / "config.yaml"
    path.write_text(f"hooks:\n  ok:\n    - command: [{hook}]\n")
    result = cli("check-config", "--config", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{path}: events: not given, so the default events apply" in result.stderr
    assert "checkpoint, drain, shutdown, undrain not defined under hooks (defined: ok)" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr


def test_every_problem_is_reported_at_once_with_file_and_key_path(tmp_path, hook):
    found = problems(
        tmp_path,
        f"""
metadata:
  url: ftp://example
  poll_interval: 0.01
  timeout: "fast"
  retries: 3
approve: sometimes
state_dir: relative/dir
hooks:
  drain:
    - command: "{hook} --all"
  ok:
    - command: [relative/hook]
      timeout: -1
events:
  Reboot: [drain, missing]
  Rebooot: [ok]
environment:
  SCHEDULED_EVENT_ID: x
extra: 1
""",
    )
    path = str(tmp_path / "config.yaml")
    assert all(p.startswith(f"{path}: ") for p in found)
    text = "\n".join(found)
    for expected in (
        "metadata.url: must be an http(s):// URL",
        "metadata.poll_interval: must be between 0.25 and 60",
        "metadata.timeout: must be a number of seconds, got a string",
        "metadata.retries: unknown key",
        "approve: must be one of sole, all, always, never",
        "state_dir: must be an absolute path",
        "hooks.drain[0].command: must be a list (argv; no shell runs it)",
        "hooks.ok[0].command[0]: must be an absolute path",
        "hooks.ok[0].timeout: must be between",
        "events.Reboot[1]: hook 'missing' is not defined",
        "events.Rebooot: unknown event type",
        "environment.SCHEDULED_EVENT_ID: SCHEDULED_EVENT_* variables are set by the daemon",
        "extra: unknown key",
    ):
        assert expected in text, f"missing: {expected}\n{text}"
    assert len(found) == 13


def test_hook_commands_must_be_safe_executables(tmp_path, hook):
    plain = tmp_path / "plain"
    plain.write_text("x")
    writable = tmp_path / "writable"
    writable.write_text("#!/bin/sh\n")
    writable.chmod(0o777)
    found = "\n".join(
        problems(
            tmp_path,
            f"hooks:\n  a:\n    - command: [{tmp_path}/nope]\n  b:\n    - command: [{plain}]\n"
            f"  c:\n    - command: [{writable}]\n  d:\n    - command: [{tmp_path}]\nevents: {{}}\n",
        )
    )
    assert "hooks.a[0].command[0]" in found
    assert "no such file" in found
    assert "hooks.b[0].command[0]" in found
    assert "not executable" in found
    assert "hooks.c[0].command[0]" in found
    assert "writable by group or others" in found
    assert "hooks.d[0].command[0]" in found
    assert "not a regular file" in found


def test_a_script_given_to_an_interpreter_is_checked_like_the_hook_itself(tmp_path):
    """[/usr/bin/python3, /opt/app/drain.py] passed while drain.py was writable by others."""
    script = tmp_path / "drain.py"
    script.write_text("print('drain')\n")
    script.chmod(0o666)
    found = problems(
        tmp_path,
        f"hooks:\n  a:\n    - command: [/usr/bin/env, {script}, --flag]\nevents: {{}}\n",
    )
    assert any(
        "hooks.a[0].command[1]" in p and "writable by group or others" in p for p in found
    ), found
    script.chmod(0o644)
    linked = tmp_path / "link.py"
    linked.symlink_to(script)
    cfg = load(tmp_path, f"hooks:\n  a:\n    - command: [/usr/bin/env, {linked}]\nevents: {{}}\n")
    assert cfg.hooks["a"].commands[0].argv[1] == str(script), "the checked file is what runs"


def test_duplicate_keys_and_yaml_syntax_errors_name_the_line(tmp_path):
    (dup,) = problems(tmp_path, "approve: sole\napprove: always\n")
    assert "line 2" in dup
    assert "duplicate key 'approve'" in dup
    (syntax,) = problems(tmp_path, "metadata:\n  url: [unclosed\n")
    assert "line" in syntax


def test_an_unquoted_api_version_date_is_read_as_the_string_meant(tmp_path):
    cfg = load(tmp_path, "metadata:\n  api_version: 2019-08-01\nhooks: {}\nevents: {}\n")
    assert cfg.metadata.api_version == "2019-08-01"


def test_a_missing_file_is_an_error_not_silent_defaults(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        loader.load(tmp_path / "absent.yaml")


def test_check_config_exits_2_with_every_problem_and_no_traceback(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("approve: maybe\nmetadata:\n  timeout: 0\n")
    result = cli("check-config", "--config", str(path))
    assert result.returncode == 2
    assert f"{path}: approve:" in result.stderr
    assert f"{path}: metadata.timeout:" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "hooks:\n  drain: []\nevents:\n  Reboot: [drain]\n",
            "hooks.drain: must be a non-empty list of commands, got an empty list",
        ),
        (
            'vm_name: ""\nhooks: {}\nevents: {}\n',
            "vm_name: must be a non-empty string, got an empty string",
        ),
        (
            "hooks:\n  drain:\n    - command: []\nevents:\n  Reboot: [drain]\n",
            "hooks.drain[0].command: must be a non-empty list of strings, got an empty list",
        ),
    ],
    ids=["hook-with-no-commands", "empty-vm-name", "command-with-no-argv"],
)
def test_an_empty_value_is_called_empty_and_a_hook_defined_empty_is_not_undefined(
    tmp_path, text, expected
):
    """check-config said "got a list" / "got a string" of an empty one, and for `drain: []`
    added a false `events.Reboot[0]: hook 'drain' is not defined under hooks (defined: none)`:
    the hook is defined, wrongly, and said so once (the schema wants its commands; an empty
    list runs nothing and is a mistake)."""
    path = tmp_path / "config.yaml"
    path.write_text(text)
    result = cli("check-config", "--config", str(path))
    assert result.returncode == 2
    assert result.stderr.splitlines()[:-1] == [f"error: {path}: {expected}"]
    assert result.stderr.splitlines()[-1] == f"{path}: 1 problem(s); nothing was started"


def test_run_with_a_bad_config_exits_2_before_doing_anything(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("vm_name: [a]\n")
    result = cli("run", "--config", str(path), "--log-target", "console", timeout=30)
    assert result.returncode == 2
    assert "vm_name: must be a non-empty string" in result.stderr
    assert "Traceback" not in result.stderr


def test_check_config_summarises_a_valid_config(tmp_path, hook):
    path = tmp_path / "config.yaml"
    path.write_text(
        f"hooks:\n  h:\n    - command: [{hook}, --flag]\nevents:\n  Reboot: [h]\n  Freeze: []\n"
    )
    result = cli("check-config", "--config", str(path), check=True)
    assert "OK" in result.stdout
    assert "Reboot:    h" in result.stdout
    assert "approve at once" in result.stdout
    assert f"{hook} --flag" in result.stdout


def _yaml_key_paths(raw):
    """The declared key paths (`hooks.*.timeout`) a loaded YAML value holds."""
    source = loader.key_paths()
    prefixes = {p.rsplit(".", n)[0] for p in source for n in range(p.count(".") + 1)}
    found = set()

    def walk(value, pattern):
        if pattern in source:
            found.add(pattern)
        if isinstance(value, dict):
            for key, item in value.items():
                for child in (f"{pattern}.{key}".lstrip("."), f"{pattern}.*"):
                    if child in prefixes:
                        walk(item, child)
                        break
        elif isinstance(value, list):
            item_pattern = f"{pattern}.*" if f"{pattern}.*" in prefixes else pattern
            for item in value:
                if isinstance(item, dict):
                    walk(item, item_pattern)

    walk(raw, "")
    return found


def _yaml_examples():
    """Every YAML block of the documentation (the site's pages and the README), by place."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for page in pages:
        text = page.read_text()
        for number, block in enumerate(re.findall(r"^ *```yaml\n(.*?)^ *```", text, re.M | re.S)):
            yield f"{page.relative_to(ROOT)} #{number}", textwrap.dedent(block)


def _commented_example(text, first_line):
    """The YAML of an example the shipped file holds as comments, from `first_line` on."""
    lines = text.splitlines()
    start = lines.index(first_line)
    block = []
    for line in lines[start:]:
        if not line.startswith("#"):
            break
        block.append(line[1:])
    return loader.parse_yaml("\n".join(block))


def test_the_shipped_config_and_the_readme_examples_hold_only_declared_keys():
    """The shipped file (generated) shows every declared key, its commented examples included;
    every hand-written YAML example of the docs and the README uses no key the schema does not
    declare."""
    source = loader.key_paths()
    shipped_text = (ROOT / "etc/scheduledeventsd/config.yaml").read_text()
    shipped = _yaml_key_paths(loader.parse_yaml(shipped_text))
    for commented in re.findall(r"^#\w+:$", shipped_text, re.MULTILINE):
        shipped |= _yaml_key_paths(_commented_example(shipped_text, commented))
    for section, heading in (("hooks", "# Each command of a hook holds:"), ("events", "# Each ev")):
        described = shipped_text.split(heading, 1)[1].split(f"\n{section}:", 1)[0]
        shipped |= {f"{section}.*.{k}" for k in re.findall(r"^#   (\w+): ", described, re.M)}
    assert shipped == source, "etc/scheduledeventsd/config.yaml"
    examples = list(_yaml_examples())
    assert len(examples) >= 10
    for place, block in examples:
        example = _yaml_key_paths(loader.parse_yaml(block))
        assert example <= source, place


def test_a_missing_default_hook_fails_check_config(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("approve: always\n")
    hook_dir = Path("/etc/scheduledeventsd/hooks")
    if all((hook_dir / name).exists() for name in loader.DEFAULT_HOOKS):
        pytest.skip("the default hooks are installed on this machine")
    result = cli("check-config", "--config", str(path))
    assert result.returncode == 2
    assert "hooks (default).drain[0].command[0]: /etc/scheduledeventsd/hooks/drain" in result.stderr
    assert "Traceback" not in result.stderr


def test_lifecycle_keys_are_checked_with_their_key_paths(tmp_path, hook):
    found = problems(
        tmp_path,
        f"hooks:\n  h:\n    - command: [{hook}]\n"
        "user_events: sometimes\n"
        "events:\n  Reboot:\n    before: [h]\n    after: [nope]\n    approve: maybe\n"
        "    short_seconds: -1\n    later: [h]\n",
    )
    assert any("user_events: must be one of hooks, approve, ignore" in p for p in found)
    assert any("events.Reboot.after[0]: hook 'nope' is not defined" in p for p in found)
    assert any("events.Reboot.approve: must be one of sole, all, always, never" in p for p in found)
    assert any("events.Reboot.short_seconds: must be a whole number 0..3600" in p for p in found)
    assert any("events.Reboot.later: unknown key" in p for p in found)


# ---- coordination (approve: all) -----------------------------------------------------------


def test_approve_all_needs_a_coordination_section(tmp_path, hook):
    found = problems(
        tmp_path, f"hooks:\n  h:\n    - command: [{hook}]\nevents: {{}}\napprove: all\n"
    )
    assert any(
        p.endswith(
            "approve: approve: all needs coordination (etcd or gate) or cluster.pacemaker "
            "to learn when the other VMs an event names are ready"
        )
        for p in found
    )
    found = problems(
        tmp_path,
        f"hooks:\n  h:\n    - command: [{hook}]\n"
        "events:\n  Reboot:\n    before: [h]\n    approve: all\n",
    )
    assert any(
        "events.Reboot.approve: approve: all needs coordination (etcd or gate)" in p for p in found
    )


def test_coordination_takes_exactly_one_of_etcd_or_gate(tmp_path, hook):
    found = problems(
        tmp_path,
        f"coordination:\n  etcd:\n    endpoints: [http://10.0.0.4:2379]\n"
        f"  gate:\n    command: [{hook}]\nhooks: {{}}\nevents: {{}}\n",
    )
    assert any(
        "coordination: must set exactly one of etcd or gate (a Pacemaker cluster goes under "
        "cluster.pacemaker), got etcd and gate" in p
        for p in found
    )
    found = problems(tmp_path, "coordination: {}\nhooks: {}\nevents: {}\n")
    assert any(
        "coordination: must set exactly one of etcd or gate (a Pacemaker cluster goes under "
        "cluster.pacemaker), got neither" in p
        for p in found
    )


def test_etcd_settings_are_checked_with_their_key_paths(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("x\n")
    secret.chmod(0o644)
    found = problems(
        tmp_path,
        "hooks: {}\nevents: {}\ncoordination:\n  etcd:\n"
        "    endpoints: [http://10.0.0.4:2379/v3, 'etcd:2379', https://10.0.0.6:2379]\n"
        "    prefix: relative\n    timeout: 0\n    cert_file: /nonexistent.pem\n"
        f"    password_file: {secret}\n    password: inline\n",
    )
    text = "\n".join(found)
    assert "coordination.etcd.endpoints[0]: must be scheme://host:port only" in text
    assert "coordination.etcd.endpoints[1]: must be an http(s):// URL with a host" in text
    assert "coordination.etcd.endpoints[2]" not in text
    assert "coordination.etcd.prefix: must start with /" in text
    assert "coordination.etcd.timeout: must be between 0.1 and 60" in text
    assert "coordination.etcd.cert_file: /nonexistent.pem: no such file or directory" in text
    assert f"coordination.etcd.password_file: {secret}: readable by group or others" in text
    assert "coordination.etcd.username: username and password_file go together" in text
    assert "coordination.etcd.password: unknown key" in text


def test_a_password_never_goes_to_etcd_in_clear(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("x\n")
    secret.chmod(0o600)
    settings = f"    username: sed\n    password_file: {secret}\n"
    found = problems(
        tmp_path,
        "hooks: {}\nevents: {}\ncoordination:\n  etcd:\n"
        "    endpoints: [https://10.0.0.4:2379, http://10.0.0.5:2379]\n" + settings,
    )
    assert any(
        "coordination.etcd.endpoints: http://10.0.0.5:2379: with a username the password would "
        "cross the network in clear" in p
        for p in found
    )
    loaded = load(
        tmp_path,
        "hooks: {}\nevents: {}\ncoordination:\n  etcd:\n"
        "    endpoints: [http://127.0.0.1:2379]\n" + settings,
    )
    assert loaded.coordination.etcd.username == "sed"


def test_the_gate_command_is_checked_like_a_hook(tmp_path, hook):
    found = problems(
        tmp_path,
        "hooks: {}\nevents: {}\ncoordination:\n  gate:\n"
        f"    command: '{hook} --ask'\n    interval: 0\n",
    )
    text = "\n".join(found)
    assert "coordination.gate.command: must be a list (argv; no shell runs it)" in text
    cfg = load(
        tmp_path,
        f"hooks: {{}}\nevents: {{}}\napprove: all\ncoordination:\n  gate:\n    command: [{hook}]\n",
    )
    assert cfg.coordination.gate.command.argv == (hook,)
    assert cfg.coordination.gate.command.timeout == 60
    assert cfg.coordination.gate.interval == 10


# ---- http, metrics, health, webhooks -------------------------------------------------------


def test_a_bad_listen_address_and_bad_webhooks_are_errors_with_their_key_paths(tmp_path):
    found = problems(
        tmp_path,
        "hooks: {}\nevents: {}\n"
        "http:\n  listen: localhost:9650\n"
        "metrics_textfile: /var/lib/node-exporter/sed.txt\n"
        "health:\n  unhealthy_from: soon\n"
        "webhooks:\n"
        "  - url: hooks.example.com/T000\n"
        "    format: xml\n"
        "    on: [detected, exploded]\n"
        "    retries: -1\n"
        '    headers: {Authorization: "a\\nb"}\n'
        "    proxy: socks\n"
        "  - {url: 'https://ok.example.com/x', timeout: 0}\n",
    )
    text = "\n".join(found)
    assert "http.listen: must be ADDRESS:PORT with a numeric address" in text
    assert "metrics_textfile: must be an absolute path ending in .prom" in text
    assert "health.unhealthy_from: must be one of detected, hooks_started, hooks_done" in text
    assert (
        "webhooks[0].url: must be an http(s):// URL with a host, got 'hooks.example.com/T000'"
        in text
    )
    assert "webhooks[0].format: must be one of json, text, got 'xml'" in text
    assert "webhooks[0].on[1]: must be one of detected, waiting, hooks_failed" in text
    assert "webhooks[0].retries: must be a whole number 0..20" in text
    assert "webhooks[0].headers.Authorization: must be a string on one line" in text
    assert "webhooks[0].proxy: must be an http(s):// URL with a host" in text
    assert "webhooks[1].timeout: must be between 0.1 and 60" in text


def test_listen_takes_ipv4_ipv6_and_any(tmp_path):
    for given, host, port in (
        ("127.0.0.1:9650", "127.0.0.1", 9650),
        ("'[::1]:9651'", "::1", 9651),
        ("0.0.0.0:80", "0.0.0.0", 80),  # noqa: S104 - parsing, not binding
    ):
        cfg = load(tmp_path, f"hooks: {{}}\nevents: {{}}\nhttp:\n  listen: {given}\n")
        assert (cfg.listen.host, cfg.listen.port) == (host, port)
    assert cfg.listen.loopback is False


def test_a_webhooks_on_key_is_on_not_true_and_yes_is_a_string(tmp_path):
    """YAML 1.1 reads `on:` as the boolean True and `yes` as true; the config reads YAML 1.2."""
    cfg = load(
        tmp_path,
        "hooks: {}\nevents: {}\nenvironment:\n  VERBOSE: yes\n"
        "webhooks:\n  - url: https://x.example.com/h\n    on: [approved]\n",
    )
    assert cfg.webhooks[0].on == ("approved",)
    assert cfg.environment["VERBOSE"] == "yes"


# ---- the path a hook runs from ---------------------------------------------------------------


def _hook_in(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    hook = directory / "hook"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    return hook


def _command(hook: Path) -> str:
    return f"hooks:\n  h:\n    - command: [{hook}]\nevents:\n  Reboot: [h]\n"


def test_a_hook_in_a_directory_others_can_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    hook = _hook_in(shared)
    shared.chmod(0o777)
    found = problems(tmp_path, _command(hook))
    assert any(
        f"hooks.h[0].command[0]: {hook}: its directory {shared} is writable by group or others" in p
        for p in found
    )


def test_a_hook_in_a_directory_another_user_owns_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    hook = _hook_in(theirs / "bin")
    os.chown(theirs, 65534, 65534)
    found = problems(tmp_path, _command(hook))
    assert any(f"its directory {theirs} is owned by uid 65534" in p for p in found)


def test_a_root_owned_sticky_directory_like_tmp_is_fine(tmp_path):
    sticky = tmp_path / "sticky"
    hook = _hook_in(sticky)
    sticky.chmod(0o1777)
    assert load(tmp_path, _command(hook)).hooks["h"].commands[0].argv == (str(hook),)


def test_the_file_that_runs_is_the_file_that_was_checked_not_a_symlink(tmp_path):
    """A symlink is resolved once, checked with every directory above its target, and the
    target is what runs: retargeting the link later changes nothing until a reload checks it."""
    target = _hook_in(tmp_path / "real")
    link = tmp_path / "link"
    link.symlink_to(target)
    cfg = load(tmp_path, _command(link))
    assert cfg.hooks["h"].commands[0].argv == (str(target),)
    unsafe = tmp_path / "unsafe"
    bad = _hook_in(unsafe)
    unsafe.chmod(0o777)
    link.unlink()
    link.symlink_to(bad)
    found = problems(tmp_path, _command(link))
    assert any(f"{link} " not in p and f"its directory {unsafe} is writable" in p for p in found)


def test_webhook_secrets_in_a_file_others_can_read_are_warned_about(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(
        "hooks: {}\nevents: {}\nwebhooks:\n  - url: https://hooks.example.com/T0/B0/SECRET\n"
        "    headers: {Authorization: Bearer x}\n"
    )
    path.chmod(0o644)
    shown = cli("check-config", "--config", str(path), "--quiet")
    assert shown.returncode == 0
    assert shown.stderr == (
        f"warning: {path}: webhooks[0].headers: a secret in a file readable by group or others "
        f"(mode 644); chmod 600 {path}\n"
    )
    path.chmod(0o600)
    assert cli("check-config", "--config", str(path), "--quiet").stderr == ""


def test_a_list_as_a_key_is_a_yaml_error_not_a_traceback(tmp_path):
    """Found by atheris: `[]: x` made the duplicate-key check raise TypeError."""
    found = problems(tmp_path, "[]:\n  - x\n")
    assert any("line 1, column 1: a list cannot be a key" in p for p in found)
    path = tmp_path / "config.yaml"
    shown = cli("check-config", "--config", str(path))
    assert shown.returncode == 2
    assert "Traceback" not in shown.stderr


def test_a_metrics_textfile_that_is_a_symlink_is_refused(tmp_path):
    """The daemon writes it as root: a link planted there is not where root asked to write."""
    target = tmp_path / "elsewhere"
    link = tmp_path / "scheduledeventsd.prom"
    link.symlink_to(target)
    found = problems(tmp_path, f"metrics_textfile: {link}\n")
    assert any(f"metrics_textfile: {link} is a symbolic link" in problem for problem in found), (
        found
    )


def test_a_yaml_alias_bomb_is_refused_at_once_with_a_short_error(tmp_path):
    """474 bytes of nested aliases made a 122 MB error message and 264 MiB RSS in 1.5 s."""
    levels = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for n in range(1, 9):
        levels.append(f"a{n}: &a{n} [" + ", ".join([f"*a{n - 1}"] * 10) + "]")
    levels.append("approve: *a8")  # quoted in its error message, it was 10^9 strings long
    path = tmp_path / "config.yaml"
    path.write_text("\n".join(levels) + "\n")
    assert len(path.read_bytes()) < 620
    result = cli("check-config", "--config", str(path))
    assert result.returncode == 2
    assert "aliases (*name) are not allowed" in result.stderr
    assert len(result.stderr) < 1000
    assert "Traceback" not in result.stderr


def test_a_config_over_a_mebibyte_is_refused_unread(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("# " + "x" * (1 << 20) + "\n")
    with pytest.raises(ConfigError, match="larger than 1024 KiB"):
        loader.load(path)


def test_no_problem_quotes_an_unbounded_value(tmp_path):
    found = problems(tmp_path, f"approve: {'x' * 100_000}\nvm_name: '{'y z' * 50_000}'\n")
    huge = [p for p in found if ": approve:" in p or ": vm_name:" in p]
    assert len(huge) == 2
    assert all(len(p) < 600 for p in found), [len(p) for p in found]
    assert any("characters)" in p for p in found)


def test_a_config_nested_thousands_deep_is_an_error_not_a_crash(tmp_path):
    """Found by atheris once aliases were refused: `[[{{{[[...` raised RecursionError."""
    path = tmp_path / "config.yaml"
    path.write_text("[[{{{" + "[" * 4000)
    result = cli("check-config", "--config", str(path))
    assert result.returncode == 2
    assert "nested too deeply to be a configuration" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_number_with_a_leading_zero_is_decimal_as_yaml_1_2_reads_it_not_octal(tmp_path):
    """PyYAML reads YAML 1.1, where `010` is octal 8: `timeout: 010` was 8 s without a word
    (and `08` a string). The config reads YAML 1.2: `010` is ten; octal says so, `0o10`."""
    cfg = load(tmp_path, "hooks: {}\nevents: {}\nmetadata:\n  timeout: 010\n")
    assert cfg.metadata.timeout == 10
    cfg = load(
        tmp_path,
        "hooks: {}\nevents: {}\nmetadata:\n  poll_interval: 08\n  first_call_timeout: 0o20\n"
        "environment:\n  ZONE: 010\n",
    )
    assert cfg.metadata.poll_interval == 8
    assert cfg.metadata.first_call_timeout == 16
    assert cfg.environment["ZONE"] == "10"
    path = tmp_path / "bad.yaml"
    path.write_text("metadata:\n  timeout: 0o9\n")  # no octal: text, named by its key path
    result = cli("check-config", "--config", str(path))
    assert result.returncode == 2
    assert f"{path}: metadata.timeout: must be a number of seconds, got a string" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_surrogate_escape_is_refused_where_it_is_written_not_at_the_hooks_start(tmp_path):
    """`"\\ud800"` is a valid YAML escape that makes a lone surrogate: in `environment:` every
    hook failed to start ("surrogates not allowed"), in `vm_name` the journald records naming it."""
    path = tmp_path / "config.yaml"
    path.write_text('hooks: {}\nevents: {}\nenvironment:\n  SITE: "berlin \\ud800"\n')
    result = cli("check-config", "--config", str(path))
    assert result.returncode == 2
    assert f"{path}: line 4, column 9: a surrogate escape" in result.stderr
    assert "Traceback" not in result.stderr
    cfg = load(tmp_path, 'hooks: {}\nevents: {}\nvm_name: "vm-\\u00e9\\U0001F600"\n')
    assert cfg.vm_name == "vm-\u00e9\U0001f600", "other escapes are characters"


# ---- cluster: independent of coordination (issue 27) ----------------------------------------

CLUSTER = "  pacemaker:\n    method: standby\n    nodes: {vm-a: node1}\n    drain_timeout: 30\n"


def test_slots_and_a_pacemaker_drain_load_together(tmp_path, hook):
    """Before issue 27 `coordination` took one of etcd, gate or pacemaker, and `concurrency`
    needed etcd: a node could not both take a slot and be drained. Now it can."""
    cfg = load(
        tmp_path,
        f"hooks:\n  h:\n    - command: [{hook}]\nevents:\n  Reboot: [h]\n"
        "coordination:\n  etcd:\n    endpoints: [http://127.0.0.1:2379]\n"
        "concurrency:\n  group: web\n  max: 2\n"
        f"cluster:\n{CLUSTER}",
    )
    assert cfg.coordination.etcd.endpoints == ("http://127.0.0.1:2379",)
    assert cfg.concurrency == config.Concurrency("web", 2)
    assert cfg.cluster.method is config.DrainMethod.STANDBY
    assert cfg.cluster.node_of("VM-A") == "node1"
    assert cfg.warnings == ()
    shown = cli("check-config", "--config", str(tmp_path / "config.yaml"), check=True)
    assert shown.stdout.count("coordination: etcd http://127.0.0.1:2379") == 1
    assert shown.stdout.count("concurrency: group web, 2 slot(s)") == 1
    assert (
        shown.stdout.count("cluster:   pacemaker, method standby; drains for Reboot, Redeploy") == 1
    )


def test_the_old_spelling_coordination_pacemaker_loads_the_same_cluster_with_a_warning(
    tmp_path, hook
):
    """A file written before the split keeps working: the same settings, and check-config
    names the new spelling (on stderr, exit 0)."""
    rest = f"hooks:\n  h:\n    - command: [{hook}]\nevents:\n  Reboot: [h]\napprove: all\n"
    new = load(tmp_path, f"{rest}cluster:\n{CLUSTER}")
    old = load(tmp_path, f"{rest}coordination:\n{CLUSTER}")
    assert old.cluster == new.cluster
    assert old.cluster is not None
    assert (old.coordination, new.coordination) == (None, None)
    (warning,) = old.warnings
    assert warning.startswith("coordination.pacemaker: now spelled cluster.pacemaker")
    assert new.warnings == ()
    shown = cli("check-config", "--config", str(tmp_path / "config.yaml"), check=True)
    assert "warning: coordination.pacemaker: now spelled cluster.pacemaker" in shown.stderr
    assert "cluster:   pacemaker, method standby" in shown.stdout
    # The old spelling beside etcd (refused before, as two engines) is etcd and a cluster now.
    both = load(
        tmp_path,
        f"{rest}coordination:\n  etcd:\n    endpoints: [http://127.0.0.1:2379]\n{CLUSTER}",
    )
    assert both.coordination.etcd is not None
    assert both.cluster == new.cluster


def test_the_old_spelling_is_checked_where_it_is_written_and_not_beside_the_new_one(tmp_path):
    found = problems(
        tmp_path, "hooks: {}\nevents: {}\ncoordination:\n  pacemaker:\n    method: x\n"
    )
    assert any(
        p.endswith("coordination.pacemaker.method: must be one of health, standby, got 'x'")
        for p in found
    ), found
    found = problems(
        tmp_path,
        f"hooks: {{}}\nevents: {{}}\ncoordination:\n{CLUSTER}cluster:\n{CLUSTER}",
    )
    assert any(
        "coordination.pacemaker: given as well as cluster.pacemaker: keep only cluster.pacemaker"
        in p
        for p in found
    ), found


def test_a_gate_and_a_cluster_load_together(tmp_path, hook):
    cfg = load(
        tmp_path,
        f"hooks: {{}}\nevents: {{}}\napprove: all\ncoordination:\n  gate:\n"
        f"    command: [{hook}]\ncluster:\n{CLUSTER}",
    )
    assert cfg.coordination.gate.command.argv == (hook,)
    assert cfg.cluster is not None


def _run(code: str) -> None:
    """`code` in a fresh interpreter: what it imports is not hidden by what the tests did."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_the_settings_and_their_checks_import_no_yaml():
    """PyYAML is imported only where a file is read: checking an already-read value does not
    load it (issue 27: the engine imported config.py, and with it PyYAML, for its types)."""
    _run(
        "import sys\n"
        "from scheduledeventsd.config import loader\n"
        "loader.parse({'hooks': {}, 'events': {}}, 'x', check_files=False)\n"
        "assert 'yaml' not in sys.modules, 'yaml imported'\n"
        "loader.parse_yaml('a: 1')\n"
        "assert 'yaml' in sys.modules\n"
    )


def test_the_engine_and_the_settings_load_neither_the_checks_nor_yaml():
    """The settings the engine takes its types from come without the loader: its walker
    (urllib.parse), its YAML reader (PyYAML). test_layers says the same of the source (and of
    urllib, which pathlib imports anyway before 3.13); this says it of a real import."""
    _run(
        "import sys\n"
        "import scheduledeventsd.engine, scheduledeventsd.config\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'yaml'\n"
        "    or m.startswith('scheduledeventsd.config.') and m.split('.')[2] in\n"
        "    ('loader', 'walker', 'sections', 'fleet', 'logic', 'files', 'yaml'))\n"
        "assert not loaded, loaded\n"
    )


def _held(hold_max: int, timeout: float, events: dict) -> config.Config:
    return loader.parse(
        {
            "vm_name": "vm-a",
            "coordination": {"etcd": {"endpoints": ["http://127.0.0.1:2379"]}},
            "concurrency": {"group": "web", "hold_max": hold_max},
            "hooks": {"drain": [{"command": ["/bin/true"], "timeout": timeout}]},
            "events": events,
        },
        "test",
        check_files=False,
    )


def test_hold_max_shorter_than_a_hook_timeout_plus_the_types_usual_impact_is_warned_about():
    """Issue 28: a slot freed while its VM is still down (or undraining) lets the next VM go.
    The longest impact of the types that take slots counts (a Redeploy's 20 min here)."""
    both = {"Reboot": ["drain"], "Redeploy": ["drain"]}
    (warning,) = _held(1400, 300, both).warnings
    assert warning.startswith("concurrency.hold_max: 1400 s is shorter than")
    assert "(300 s) plus a Redeploy's usual impact (1200 s)" in warning
    assert not _held(1500, 300, both).warnings, "1500 >= 300 + 1200"
    assert not _held(700, 60, {"Reboot": ["drain"]}).warnings, "a Reboot's 600 s"
    assert not _held(5, 60, {"Terminate": ["drain"]}).warnings, "takes no slot, never back"
    assert loader.parse({"vm_name": "a"}, "test", check_files=False).warnings == ()


# ---- issue 28: several limits at once ---------------------------------------------------------

ETCD_SECTION = "coordination:\n  etcd:\n    endpoints: [http://127.0.0.1:2379]\n"


def test_concurrency_as_a_list_holds_a_limit_per_group_and_the_mapping_form_still_loads(
    tmp_path, hook
):
    """Issue 28: `concurrency` takes a list of mappings (a tier and a zone), each a group and
    its max, ttl given once; the mapping form loads as before (one limit)."""
    rest = f"hooks:\n  h:\n    - command: [{hook}]\nevents:\n  Reboot: [h]\n{ETCD_SECTION}"
    cfg = load(
        tmp_path,
        f"{rest}concurrency:\n  - {{group: web, max: 1}}\n  - {{group: zone-1, max: 2, ttl: 12}}\n",
    )
    assert cfg.concurrency.limits == (config.Limit("web", 1), config.Limit("zone-1", 2))
    assert cfg.concurrency.groups == ("web", "zone-1")
    assert cfg.concurrency.ttl == 12
    shown = cli("check-config", "--config", str(tmp_path / "config.yaml"), check=True)
    assert "concurrency: group web, 1 slot(s); group zone-1, 2 slot(s), ttl 12s, by etcd" in (
        shown.stdout
    )
    single = load(tmp_path, f"{rest}concurrency: {{group: web, max: 3}}\n")
    assert single.concurrency == config.Concurrency("web", 3)
    assert single.concurrency.limits == (config.Limit("web", 3),)


def test_a_concurrency_list_names_each_problem_by_its_item(tmp_path, hook):
    """A group given twice, a ttl that differs (one lease holds every group's slot), a bad
    item and an empty list: each named by file and key path, all in one run."""
    rest = f"hooks:\n  h:\n    - command: [{hook}]\nevents:\n  Reboot: [h]\n{ETCD_SECTION}"
    found = problems(
        tmp_path,
        f"{rest}concurrency:\n  - {{group: web, ttl: 10}}\n  - {{group: web}}\n"
        "  - {group: zone-1, max: 0, ttl: 20}\n  - 7\n  - {max: 2}\n",
    )
    where = str(tmp_path / "config.yaml")
    assert f"{where}: concurrency[1].group: 'web' is given twice: one limit per group" in found
    assert any(p.startswith(f"{where}: concurrency[2].max: must be a whole number") for p in found)
    assert any(p.startswith(f"{where}: concurrency[2].ttl: 20 differs from") for p in found)
    assert f"{where}: concurrency[3]: must be a mapping, got a number" in found
    assert any(p.startswith(f"{where}: concurrency[4].group: required") for p in found)
    empty = problems(tmp_path, f"{rest}concurrency: []\n")
    expected = "must be a mapping or a non-empty list of mappings, got an empty list"
    assert empty == [f"{where}: concurrency: {expected}"]
