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
    assert "SUCCESS: 8 rules found" in checked.stdout


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


ALERT_TESTS = ALERTS.with_name("alerts_test.yml")


def test_every_alert_fires_when_it_should_and_only_then() -> None:
    tested = subprocess.run(
        ["promtool", "test", "rules", str(ALERT_TESTS)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert tested.returncode == 0, tested.stdout + tested.stderr
    rules = [r for group in yaml.safe_load(ALERTS.read_text())["groups"] for r in group["rules"]]
    cases = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    named = [c["alertname"] for case in cases for c in case["alert_rule_test"]]
    fired = [c["alertname"] for case in cases for c in case["alert_rule_test"] if c["exp_alerts"]]
    for rule in rules:  # each alert seen firing, and seen silent
        assert rule["alert"] in fired and named.count(rule["alert"]) >= 2, rule["alert"]


def test_the_test_series_are_shaped_like_the_real_scrape() -> None:
    """Each input series of alerts_test.yml names a metric the processes export with exactly its
    labels (and the job and instance labels a scrape adds): the tests cannot pass on series the
    processes never send."""
    labels_of = {}
    for metric in vars(metrics).values():
        if isinstance(metric, MetricWrapperBase):
            suffix = "_total" if metric._type == "counter" else ""
            labels_of[metric._name + suffix] = {*metric._labelnames, "job", "instance"}
    series = [s["series"] for case in yaml.safe_load(ALERT_TESTS.read_text())["tests"]
              for s in case["input_series"]]  # fmt: skip
    assert series
    for one in series:
        name, _, rest = one.partition("{")
        labels = {pair.split("=")[0] for pair in rest.rstrip("}").split(",")}
        assert labels == labels_of[name], one


def test_a_dead_letter_reason_is_a_series_at_zero_before_its_first_letter() -> None:
    from prometheus_client import REGISTRY, generate_latest

    from saga_coordinator.dead_letters import DeadLetterIngester
    from saga_shared.config import Settings

    DeadLetterIngester(Settings(), bus=None, store=None)  # type: ignore[arg-type]
    scraped = generate_latest(REGISTRY).decode()
    for reason in metrics.DEAD_LETTER_REASONS:
        assert f'saga_dead_letters_total{{reason="{reason}"}}' in scraped, reason


def test_only_the_process_that_reads_the_database_exports_its_gauges() -> None:
    import sys

    from prometheus_client import CollectorRegistry, generate_latest

    # Every module of every process imported, nothing started: an adapter process's scrape.
    script = (
        "import saga_app.cli, saga_app.stack\n"
        "from prometheus_client import generate_latest\n"
        "print(generate_latest().decode())\n"
    )
    adapter = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert "saga_dead_letters_total" in adapter  # the counters are there
    for gauge in metrics.DATABASE_GAUGES:
        assert f"# TYPE {gauge._name} gauge" not in adapter, gauge._name
    coordinator = CollectorRegistry()
    metrics.export_database_gauges(coordinator)
    metrics.export_database_gauges(coordinator)  # once, however often the gauges start
    scraped = generate_latest(coordinator).decode()
    for gauge in metrics.DATABASE_GAUGES:
        assert f"# TYPE {gauge._name} gauge" in scraped, gauge._name
