"""The Grafana dashboard and the alert rules query only metrics the code exports, and promtool accepts
the rules."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from observe_helpers import exported_sample_names, need_tool

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "prewarm.json"
RULES = sorted((REPO / "deploy" / "prometheus").glob("*.yml"))
# A metric name in PromQL: an identifier not followed by "(" (a function) and not a label name inside
# braces or a by/without list, which the expressions here never start with "prewarm_".
_METRIC = re.compile(r"\bprewarm_[A-Za-z0-9_:]+\b")


@pytest.fixture(scope="module")
def exported() -> set[str]:
    return exported_sample_names()


def _dashboard_exprs() -> list[str]:
    exprs: list[str] = []

    def walk(panels: list[dict[str, object]]) -> None:
        for panel in panels:
            for target in panel.get("targets", []) or []:  # type: ignore[attr-defined]
                exprs.append(target["expr"])
            walk(panel.get("panels", []) or [])  # type: ignore[arg-type]

    walk(json.loads(DASHBOARD.read_text())["panels"])
    return exprs


def _rule_exprs() -> list[str]:
    return [
        str(rule["expr"])
        for path in RULES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    ]


def test_every_metric_the_dashboard_queries_is_exported(exported: set[str]) -> None:
    exprs = _dashboard_exprs()
    queried = {name for expr in exprs for name in _METRIC.findall(expr)}
    assert len(exprs) >= 20  # a real dashboard, not an empty shell
    assert len(queried) >= 20
    assert sorted(queried - exported) == []


def test_every_metric_the_alert_rules_query_is_exported(exported: set[str]) -> None:
    queried = {name for expr in _rule_exprs() for name in _METRIC.findall(expr)}
    assert {"prewarm_ingest_lag_records", "prewarm_scheduler_active"} <= queried
    assert sorted(queried - exported) == []
    # The rules' unit tests feed them series by the same names.
    tests = yaml.safe_load((REPO / "deploy" / "prometheus" / "tests" / "prewarm-alerts-test.yml").read_text())
    fed = {_METRIC.findall(s["series"])[0] for t in tests["tests"] for s in t["input_series"]}
    assert sorted(fed - exported) == []


def test_the_issue_s_alerts_are_all_there() -> None:
    alerts = {
        rule["alert"]
        for path in RULES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    }
    assert {
        "PrewarmIngestConsumerLag",
        "PrewarmNoActiveScheduler",
        "PrewarmExecutorNotReporting",
        "PrewarmMispredictionRatioHigh",
        "PrewarmForecastSkillBelowBaseline",
        "PrewarmTierNearFull",
    } <= alerts


def test_a_name_the_code_does_not_export_is_caught(exported: set[str]) -> None:
    # The check reads the registry: a misspelt name in a query is not "exported".
    assert "prewarm_executor_prefetches_total" in exported
    assert "prewarm_executor_prefetch_total" not in exported


def test_promtool_accepts_the_rules() -> None:
    promtool = need_tool("promtool")
    done = subprocess.run(
        [promtool, "check", "rules", *map(str, RULES)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_docs_list_every_metric_the_code_registers(exported: set[str]) -> None:
    documented = set(_METRIC.findall((REPO / "docs" / "metrics.md").read_text()))
    families = {name for name in exported if name.startswith("prewarm_") and not name.endswith("_created")}
    # A family is documented under the name it is queried by: counters end in _total, the rest as named.
    missing = {
        name
        for name in families
        if name not in documented
        and not any(name == d + suffix for d in documented for suffix in ("_bucket", "_count", "_sum"))
    }
    assert sorted(missing) == []


def test_the_alerts_fire_on_the_series_their_unit_tests_feed_them() -> None:
    # Each alert of the issue, fed series the code exports: fires when it should, and not before.
    promtool = need_tool("promtool")
    tests = REPO / "deploy" / "prometheus" / "tests" / "prewarm-alerts-test.yml"
    done = subprocess.run(
        [promtool, "test", "rules", str(tests)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout
