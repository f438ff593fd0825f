"""The Prometheus alert rules and the Grafana dashboard that ship with the project: valid, and
naming only metrics the processes export (a renamed metric would silence an alert)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml
from prometheus_client.metrics import MetricWrapperBase

from saga_shared.observability import metrics

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "saga-dashboard.json"
NAME = re.compile(r"\bsaga_[a-z_]+\b")


def exported() -> set[str]:
    """Every series name the processes expose."""
    names: set[str] = set()
    for metric in vars(metrics).values():
        if not isinstance(metric, MetricWrapperBase):
            continue
        base, kind = metric._name, str(metric._type)
        names |= {
            "counter": {f"{base}_total"},
            "gauge": {base},
            "histogram": {f"{base}_bucket", f"{base}_count", f"{base}_sum"},
        }[kind]
    return names


def test_promtool_accepts_the_alert_rules() -> None:
    checked = subprocess.run(
        ["promtool", "check", "rules", str(ALERTS)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 6 rules found" in checked.stdout


def test_every_alert_names_exported_metrics_and_says_what_to_do() -> None:
    rules = [r for group in yaml.safe_load(ALERTS.read_text())["groups"] for r in group["rules"]]

    assert {r["alert"] for r in rules} >= {
        "SagaNeedsHumanWaiting", "SagaDeadLettersGrowing", "SagaOutboxLagging",
    }  # fmt: skip
    for rule in rules:
        assert set(NAME.findall(rule["expr"])) <= exported(), rule["alert"]
        assert rule["labels"]["severity"] in ("page", "ticket")
        assert (
            "saga " in rule["annotations"]["description"]
            or "broker" in rule["annotations"]["description"]
        )


def test_every_dashboard_panel_queries_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]

    assert len(exprs) >= 10
    used = {name for expr in exprs for name in NAME.findall(expr)}
    assert used <= exported()
    assert {"saga_people_queue", "saga_outbox_lag_seconds", "saga_dead_letters_total"} <= used
