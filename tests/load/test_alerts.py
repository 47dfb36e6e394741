"""deploy/prometheus/alerts.yml: generated from the SLO `llmtrace load --slo` takes, querying only
series llmtrace and the collector export, and unit-tested with a real promtool (built from the
Go module proxy and cached, like Jaeger: scripts/otel_stack/binaries.py)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from llmtrace.cli import main
from llmtrace.load.alerts import render_alerts
from llmtrace.load.slo import parse_slo
from scripts.otel_stack.binaries import build_promtool
from tests.test_collector_configs import _expr_metric_names, _series_names

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
ALERTS = DEPLOY / "alerts.yml"


def _committed_slo() -> str:
    header = ALERTS.read_text().splitlines()[0]
    found = re.search(r"--slo (\S+)", header)
    assert found, header
    return found.group(1)


def test_the_committed_rules_are_what_the_generator_writes_for_their_slo(tmp_path: Path) -> None:
    assert render_alerts(parse_slo(_committed_slo())) == ALERTS.read_text()
    assert 0 == main(["load", "--slo", _committed_slo(), "--alerts", str(tmp_path / "a.yml")])
    assert ALERTS.read_text() == (tmp_path / "a.yml").read_text()


def test_only_the_objectives_given_become_latency_alerts() -> None:
    names = {r["alert"] for r in yaml.safe_load(render_alerts(parse_slo("tpot=80ms")))["groups"][0]["rules"]}
    assert {"LLMTraceTPOTOverSLO", "LLMTraceErrorRatio", "LLMTraceSpansDropped", "LLMTraceGPUIdleWithWork"} == names


def test_the_rules_query_only_series_llmtrace_and_the_collector_export() -> None:
    rules = yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"]
    used = set().union(*(_expr_metric_names(r["expr"]) for r in rules)) - {"and", "llm_engine_id"}
    assert set() == used - _series_names()


def test_docker_compose_prometheus_loads_the_rules() -> None:
    root = DEPLOY.parents[1]
    config = yaml.safe_load((root / "deploy" / "prometheus.yml").read_text())
    assert ["alerts.yml"] == config["rule_files"]
    volumes = yaml.safe_load((root / "docker-compose.yml").read_text())["services"]["prometheus"]["volumes"]
    assert "./deploy/prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro" in volumes


@pytest.mark.stack
def test_promtool_checks_and_unit_tests_the_rules() -> None:
    """`promtool check rules` and `promtool test rules alerts.test.yml` (each alert fires for the
    service that breaks its objective, not for the one that keeps it)."""
    promtool = str(build_promtool())
    check = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, check=False)
    assert 0 == check.returncode, check.stdout + check.stderr
    unit = subprocess.run([promtool, "test", "rules", "alerts.test.yml"], cwd=DEPLOY, capture_output=True, text=True,
                          check=False)
    assert 0 == unit.returncode, unit.stdout + unit.stderr
    assert "SUCCESS" in unit.stdout + unit.stderr
