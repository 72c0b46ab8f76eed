"""The schema is the one declaration of the config: the validator enforces exactly what it
declares (keys, kinds, ranges, choices, defaults) and the documents generated from it are fresh."""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduledeventsd import config
from scheduledeventsd.config import loader, schema
from scheduledeventsd.config.provider import DEFAULT_URLS, Provider
from scheduledeventsd.config.schema import Key, Kind
from scheduledeventsd.windows import Window

ROOT = Path(__file__).parents[2]
CONCRETE = {"NAME": "drain", "TYPE": "Reboot"}


def concrete(path: str) -> str:
    """A declared path as an error names it: `hooks.NAME[].timeout` -> `hooks.drain[0].timeout`."""
    parts = []
    for part in path.split("."):
        name = part.removesuffix("[]")
        name = CONCRETE.get(name, name)
        parts.append(f"{name}[0]" if part.endswith("[]") else name)
    return ".".join(parts).replace(".[0]", "[0]")


def place(raw: dict[str, Any], path: str, value: Any) -> None:
    """Put `value` at a declared path of `raw`, making the sections and list items on the way."""
    parts = path.split(".")
    node: Any = raw
    for part in parts[:-1]:
        name = CONCRETE.get(part.removesuffix("[]"), part.removesuffix("[]"))
        node = node.setdefault(name, [{}])[0] if part.endswith("[]") else node.setdefault(name, {})
    last = parts[-1]
    node[CONCRETE.get(last, last)] = value


def shown(key: Key) -> Any:
    """What a full config sets a key to: its example, else its default."""
    return loader.parse_yaml(key.example) if key.example is not None else key.default


COORDINATIONS = ("etcd", "gate")
SECTIONS = (Kind.SECTION, Kind.SECTIONS)  # a mapping of keys (or a list of them)


def full(keep: str) -> dict[str, Any]:
    """Every declared key set, from its example or default (of the coordination engines only
    `keep`; concurrency goes with etcd; the Pacemaker cluster, independent of both, is in each)."""
    raw: dict[str, Any] = {"approve": "all"}
    others = [f"coordination.{c}" for c in COORDINATIONS if c != keep]
    for key in schema.KEYS:
        if key.kind in SECTIONS or key.path.startswith(tuple(others)):
            continue
        if keep != "etcd" and key.path.startswith("concurrency"):
            continue
        if schema.children(key.path) or schema.children(f"{key.path}[]"):
            continue  # made by their entries
        if key.path in ("hooks", "events"):
            continue
        if key.example is None and key.default is None:
            continue
        place(raw, key.path, shown(key))
    raw["events"]["Reboot"]["before"] = ["drain"]
    raw["events"]["Reboot"]["fast"] = ["drain"]
    return raw


FULL_ETCD = full("etcd")
FULL_GATE = full("gate")
LEAVES = [k for k in schema.KEYS if k.kind not in SECTIONS]


def parse(raw: dict[str, Any]) -> config.Config:
    return loader.parse(raw, "t.yaml", check_files=False)


def problems(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(config.ConfigError) as e:
        parse(raw)
    return e.value.problems


def base_for(path: str) -> dict[str, Any]:
    return copy.deepcopy(FULL_GATE if path.startswith("coordination.gate") else FULL_ETCD)


def test_a_config_of_every_declared_key_at_its_example_or_default_is_valid():
    """FULL_ETCD holds slots (concurrency) and a Pacemaker cluster together: before issue 27
    split `cluster` from `coordination`, no configuration could."""
    for raw in (FULL_ETCD, FULL_GATE):
        cfg = parse(raw)
        assert cfg.events["Reboot"].short_seconds == 9
        assert cfg.hooks["drain"].commands[0].argv[0] == "/usr/bin/python3"
        assert cfg.cluster.nodes == {"sap-vm-1": "hana1", "sap-vm-2": "hana2"}
    assert parse(FULL_ETCD).coordination.etcd is not None
    assert parse(FULL_ETCD).concurrency.group == "web"
    assert parse(FULL_GATE).coordination.gate is not None


@pytest.mark.parametrize(
    "key", LEAVES + [k for k in schema.KEYS if k.kind in SECTIONS], ids=lambda k: k.path
)
def test_every_declared_key_is_checked_and_a_wrong_kind_is_named_by_its_key_path(key):
    """A key the schema declares but the validator never reads would be accepted and ignored."""
    raw = base_for(key.path)
    wrong = [1] if key.kind in (*SECTIONS, Kind.NAMED) else {"x": [1]}
    place(raw, key.path, wrong)
    where = concrete(key.path)
    found = [p for p in problems(raw) if p.startswith(f"t.yaml: {where}")]
    assert found, f"{where}: a wrong value was not named: {problems(raw)}"


RANGED = [k for k in schema.KEYS if k.low is not None]


@pytest.mark.parametrize("key", RANGED, ids=lambda k: k.path)
def test_every_declared_range_is_enforced_at_its_key_path(key):
    step = 1 if key.kind is Kind.WHOLE else 0.01
    for value in (key.low - step, key.high + step):
        raw = base_for(key.path)
        place(raw, key.path, value)
        found = [p for p in problems(raw) if p.startswith(f"t.yaml: {concrete(key.path)}:")]
        assert len(found) == 1, (value, found)
        assert f"{key.low:g}" in found[0] or key.path == "metadata.first_call_timeout"
        assert f"{key.high:g}" in found[0]


@pytest.mark.parametrize("bound", ["low", "high"])
def test_every_declared_range_includes_its_bounds(bound):
    for base in (FULL_ETCD, FULL_GATE):
        raw = copy.deepcopy(base)
        for key in RANGED:
            chosen = raw["coordination"]
            if key.path.startswith("coordination.") and not any(
                key.path.startswith(f"coordination.{kind}.") for kind in chosen
            ):
                continue
            if key.path.startswith("concurrency.") and "concurrency" not in raw:
                continue
            value = getattr(key, bound)
            place(raw, key.path, int(value) if key.kind is Kind.WHOLE else value)
        parse(raw)


CHOICES = [k for k in schema.KEYS if k.choices]


@pytest.mark.parametrize("key", CHOICES, ids=lambda k: k.path)
def test_every_declared_choice_is_accepted_and_nothing_else(key):
    for value in key.values:
        raw = base_for(key.path)
        place(raw, key.path, value)
        parse(raw)
    raw = base_for(key.path)
    place(raw, key.path, "sometimes")
    (problem,) = problems(raw)
    assert problem == (
        f"t.yaml: {concrete(key.path)}: must be one of {', '.join(key.values)}, got 'sometimes'"
    )


def test_every_section_refuses_a_key_it_does_not_declare_and_lists_the_declared_ones():
    sections = [""] + [k.path for k in schema.KEYS if k.kind in SECTIONS]
    sections += ["hooks.NAME[]", "events.TYPE", "webhooks[]"]
    for section in sections:
        raw = base_for(section)
        place(raw, f"{section}.bogus" if section else "bogus", 1)
        where = concrete(f"{section}.bogus" if section else "bogus")
        expected = ", ".join(schema.children(section))
        assert f"t.yaml: {where}: unknown key (expected one of: {expected})" in problems(raw)


def test_the_defaults_the_daemon_uses_are_the_declared_ones():
    cfg = loader.parse(None, "defaults", check_files=False)
    declared = {k.name: k.default for k in schema.KEYS if k.parent == "metadata"}
    assert declared.pop("url") is None, "each provider's own (default_text)"
    assert cfg.metadata == config.Metadata(**declared, url=DEFAULT_URLS[Provider.AZURE])
    assert cfg.approve.value == schema.key("approve").default
    assert cfg.user_events.value == schema.key("user_events").default
    assert cfg.unhealthy_from.value == schema.key("health.unhealthy_from").default
    assert str(cfg.state_dir) == schema.key("state_dir").default
    assert cfg.shutdown_grace == schema.key("shutdown_grace").default
    assert {n: [list(c.argv) for c in h.commands] for n, h in cfg.hooks.items()} == {
        n: [c["command"] for c in cmds] for n, cmds in schema.key("hooks").default.items()
    }
    webhook = parse({"webhooks": [{"url": "https://example.com/x"}]}).webhooks[0]
    for name in ("format", "on", "timeout", "retries"):
        value = getattr(webhook, name)
        declared = schema.key(f"webhooks[].{name}").default
        assert (value.value if name == "format" else value) == (
            tuple(declared) if name == "on" else declared
        )


def test_the_enums_hold_exactly_the_declared_choices():
    """Every key with choices has its enum, and each enum holds exactly those choices."""
    enums = {
        "approve": config.ApprovePolicy,
        "user_events": config.UserEvents,
        "health.unhealthy_from": config.HealthFrom,
        "webhooks[].format": config.WebhookFormat,
        "cluster.pacemaker.method": config.DrainMethod,
        "provider": config.ProviderSetting,
        "events.TYPE.approve": config.ApprovePolicy,
    }
    assert set(enums) == {k.path for k in CHOICES}
    for path, kind in enums.items():
        assert [member.value for member in kind] == list(schema.key(path).values), path
    assert ["auto", *(p.value for p in Provider)] == list(schema.key("provider").values)


# Each section and the settings class its checked values build. `renamed`: a field that holds
# another key (or none: set by the loader); `unheld`: a key that no field of it holds, and why.
SETTINGS: dict[str, tuple[Optional[type], dict[str, Any], dict[str, str]]] = {
    "": (
        config.Config,
        {
            "listen": "http.listen",
            "unhealthy_from": "health.unhealthy_from",
            "cluster": "cluster.pacemaker",
            "path": None,
            "provider_why": None,
            "warnings": None,
        },
        {"dmi_dir": "read to choose provider", "http": "listen", "health": "unhealthy_from"},
    ),
    "metadata": (config.Metadata, {}, {}),
    "hooks.NAME[]": (config.HookCommand, {"argv": "hooks.NAME[].command"}, {"command": "argv"}),
    "events.TYPE": (config.EventRule, {}, {}),
    "windows[]": (Window, {"zone": "windows[].timezone"}, {"timezone": "zone"}),
    "concurrency": (config.Concurrency, {"more": "concurrency"}, {}),
    "coordination": (config.Coordination, {}, {}),
    "coordination.etcd": (config.Etcd, {}, {}),
    "coordination.gate": (config.Gate, {}, {"timeout": "command.timeout"}),
    "cluster": (None, {}, {"pacemaker": "Config.cluster"}),
    "cluster.pacemaker": (config.Pacemaker, {}, {}),
    "webhooks[]": (config.Webhook, {}, {}),
}


@pytest.mark.parametrize("section", SETTINGS, ids=lambda s: s or "top level")
def test_every_settings_field_has_its_schema_key_and_every_key_its_field(section):
    """A field no key sets is a setting no file can change; a key no field holds is read and
    dropped. Either fails here, naming it."""
    kind, renamed, unheld = SETTINGS[section]
    fields = set() if kind is None else {f.name for f in dataclasses.fields(kind)}
    keys = set(schema.children(section))
    assert fields - set(renamed) - keys == set(), "fields without a schema key"
    assert keys - set(unheld) - fields == set(), "schema keys without a field"
    for path in renamed.values():
        assert path is None or path in schema.BY_PATH, path


def test_every_section_of_the_schema_has_its_settings_class():
    sections = {k.path for k in schema.KEYS if k.kind in SECTIONS}
    sections |= {"", "hooks.NAME[]", "events.TYPE", "windows[]", "webhooks[]"}
    assert sections - {"http", "health"} == set(SETTINGS)


def test_the_generated_reference_the_man_page_and_the_shipped_config_are_not_stale():
    """docs/config.py --check fails when any of them is stale."""
    result = subprocess.run(
        [sys.executable, "docs/config.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_staleness_check_notices_a_changed_declaration(monkeypatch):
    """A test that cannot fail is a defect: a changed doc line makes every document stale."""
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import config as generator  # noqa: PLC0415 - docs/config.py, the generator
    finally:
        sys.path.pop(0)
    before = {path: render(path.read_text()) for path, render in generator.rendered().items()}
    changed = schema.Key("vm_name", Kind.TEXT, "A changed line of documentation.", "auto")
    keys = tuple(changed if k.path == "vm_name" else k for k in schema.KEYS)
    monkeypatch.setattr(schema, "KEYS", keys)
    after = {path: render(path.read_text()) for path, render in generator.rendered().items()}
    assert all(before[path] != after[path] for path in before)
    assert all("A changed line of documentation." in text for text in after.values())


def test_every_declared_key_is_in_the_reference_table_and_the_man_page_in_declared_order():
    readme = (ROOT / "docs/reference/configuration.md").read_text()
    readme = readme.split("<!-- configuration reference", 1)[1].split("<!-- end of the conf", 1)[0]
    table = re.findall(r"^\| `([^`]+)` \|", readme, re.MULTILINE)
    assert table == [k.path for k in schema.KEYS]
    man = (ROOT / "packaging/man/scheduledeventsd.8").read_text()
    section = man[man.index(".SH CONFIGURATION") :].split("\n.SH ", 1)[0]
    lines = section.splitlines()
    documented = [
        lines[i + 1].removeprefix(".B ").replace("\\-", "-")
        for i, line in enumerate(lines[:-1])
        if line == ".TP"
    ]
    assert documented == [k.path for k in schema.KEYS]


# ---- hostile configs: the seeds (also the fuzzer's starting corpus) and every declared key ----

# Also the fuzzer's starting corpus (tests/fuzz.py; `make fuzz-quick` in CI runs from them).
SEEDS = sorted((ROOT / "tests/seeds/config").glob("*.yaml"))
BOUND = loader.MAX_PROBLEM * 2  # a problem's text plus its file and key path, each bounded


@pytest.mark.parametrize("seed", SEEDS, ids=lambda p: p.stem)
def test_a_hostile_config_is_refused_with_short_errors_and_nothing_run(seed, tmp_path):
    """Alias bombs, nesting thousands deep, python tags, NaN, control characters, huge names:
    each is refused, every problem is bounded, nothing is executed. The time bound only tells a
    refusal from an expansion (the alias bomb took minutes and gigabytes before aliases were
    refused); how fast is not this test's to say."""
    marker = Path("/tmp/pwned")
    marker.unlink(missing_ok=True)
    started = time.monotonic()
    with pytest.raises(config.ConfigError) as e:
        loader.load(seed)
    assert time.monotonic() - started < 30
    assert e.value.problems
    for problem in e.value.problems:
        assert problem.startswith(f"{seed}: ")
        assert len(problem) <= len(str(seed)) + BOUND
    assert not marker.exists()


hostile_values = st.one_of(
    st.text(min_size=1000, max_size=20_000),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=50),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**60), max_value=10**60),
    st.recursive(
        st.none() | st.booleans() | st.integers(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
        max_leaves=30,
    ),
    st.integers(1, 400).map(lambda depth: functools.reduce(lambda v, _: [v], range(depth), 1)),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(schema.KEYS), hostile_values, st.sampled_from(COORDINATIONS))
def test_any_hostile_value_at_any_declared_key_is_accepted_or_refused_with_bounded_problems(
    key, value, kept
):
    raw = copy.deepcopy(full(kept))
    if key.path.startswith("coordination.") and not key.path.startswith(f"coordination.{kept}"):
        return
    place(raw, key.path, value)
    problems = []
    try:
        parse(raw)
    except config.ConfigError as e:
        problems = e.problems
    for problem in problems:
        assert problem.startswith("t.yaml: ")
        assert len(problem) <= len("t.yaml: ") + BOUND
