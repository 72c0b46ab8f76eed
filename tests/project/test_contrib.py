"""The shipped alert rules and Grafana dashboard: valid for Prometheus (promtool, from Debian's
`prometheus`, installed by `make test`), alerting when they should, and naming only metrics
the daemon exports."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from scheduledeventsd.config import Config, Coordination, Gate, HookCommand
from scheduledeventsd.observe.metrics import Metrics

ROOT = Path(__file__).parents[2]
RULES = ROOT / "contrib/prometheus/scheduledeventsd-alerts.yml"
RULE_TESTS = ROOT / "contrib/prometheus/scheduledeventsd-alerts.test.yml"
DASHBOARD = ROOT / "contrib/grafana/scheduledeventsd-dashboard.json"
_NAME = re.compile(r"\bscheduledeventsd_[a-z_]+")


def promtool(*args: str, cwd: Path = ROOT) -> str:
    result = subprocess.run(
        ["promtool", *args], capture_output=True, text=True, cwd=cwd, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def exported_names() -> set[str]:
    """Every series name the daemon exports, from a real render of its registry."""
    gate = Coordination(gate=Gate(HookCommand(("/bin/true",))))
    text = Metrics(Config(coordination=gate)).render().decode()
    names = set()
    for family in text_string_to_metric_families(text):
        names |= {sample.name for sample in family.samples}
    return names


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for panel in dash["panels"] for t in panel["targets"]]


def test_the_alert_rules_are_valid_and_fire_when_they_should():
    promtool("check", "rules", str(RULES))
    promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)


def test_the_dashboards_queries_are_valid_promql(tmp_path):
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query_{i}", "expr": e.replace("$instance", ".*")}
                    for i, e in enumerate(dashboard_exprs())
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(rules))
    assert f"{len(rules['groups'][0]['rules'])} rules found" in promtool(
        "check", "rules", str(path)
    )


def test_rules_and_dashboard_name_only_metrics_the_daemon_exports():
    exported = exported_names()
    alerts = yaml.safe_load(RULES.read_text())
    exprs = [r["expr"] for g in alerts["groups"] for r in g["rules"]] + dashboard_exprs()
    used = {name for e in exprs for name in _NAME.findall(e)}
    assert used, "the rules name no metric"
    assert used <= exported, f"not exported: {sorted(used - exported)}"


def test_rules_and_dashboard_select_only_labels_the_daemon_exports():
    """A selector on a label the metric does not have matches nothing, silently."""
    gate = Coordination(gate=Gate(HookCommand(("/bin/true",))))
    text = Metrics(Config(coordination=gate)).render().decode()
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    alerts = yaml.safe_load(RULES.read_text())
    exprs = [r["expr"] for g in alerts["groups"] for r in g["rules"]] + dashboard_exprs()
    selectors = [m for e in exprs for m in re.findall(r"(scheduledeventsd_[a-z_]+)\{([^}]*)\}", e)]
    assert selectors, "no selector with labels"
    for name, body in selectors:
        used = set(re.findall(r"([a-z_]+)\s*[=!]~?", body)) - {"instance", "job"}
        assert used <= labels[name], f"{name}: no label {sorted(used - labels[name])}"
