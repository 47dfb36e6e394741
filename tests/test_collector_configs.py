"""Every shipped collector config is loaded by the real binary; compose, Prometheus and Grafana
files are consistent with each other and with the metric names in ``llmtrace.semconv``."""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmtrace import semconv
from scripts.otel_stack.binaries import REPO_ROOT, build_gateway_collector, build_jaeger
from scripts.otel_stack.stack import TEST_SAMPLING, GatewayStack, OtelStack, by_trace
from tests.stack.run_app import run_app

COLLECTOR = REPO_ROOT / "collector" / "otel-collector.yaml"
JAEGER = REPO_ROOT / "collector" / "jaeger.yaml"
GATEWAY_TIER1 = REPO_ROOT / "collector" / "gateway" / "tier1-loadbalancer.yaml"
COMPOSE = REPO_ROOT / "docker-compose.yml"
GATEWAY_COMPOSE = REPO_ROOT / "collector" / "gateway" / "docker-compose.yml"
DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "dashboards" / "llmtrace.json"

#: Component types of otelcol-contrib (distributions/otelcol-contrib/manifest.yaml in
#: opentelemetry-collector-releases) that Jaeger v2 also compiles in. A config meant
#: for both may use only these; Jaeger's side is checked live against `jaeger components`.
CONTRIB_AND_JAEGER = {
    "receivers": {"otlp", "nop", "jaeger", "kafka", "zipkin"},
    "processors": {"batch", "memory_limiter", "tail_sampling", "attributes", "filter"},
    "exporters": {"debug", "otlp", "otlphttp", "nop", "kafka", "prometheus"},
    "connectors": {"forward", "spanmetrics"},
    "extensions": {"pprof", "zpages", "basicauth", "sigv4auth"},  # no health check is in both
}
#: Contrib components the gateway tier needs besides those (contrib has them; Jaeger does not).
CONTRIB_GATEWAY_EXTRA = {"exporters": {"loadbalancing"}}
#: Jaeger image tag <-> Go module version built for the tests.
JAEGER_IMAGE_FOR_MODULE = {"v1.76.0": "2.13.0"}

ENV_REF = re.compile(r"\$\{env:([A-Z0-9_]+)(:-([^}]*))?\}")


def _load(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(path.read_text())
    return loaded


def _component_types(config: dict[str, Any]) -> dict[str, set[str]]:
    return {kind: {name.split("/", 1)[0] for name in config.get(kind) or {}} for kind in CONTRIB_AND_JAEGER}


def _binary_components(binary: Path) -> dict[str, set[str]]:
    out = subprocess.run([str(binary), "components"], capture_output=True, text=True, check=True, timeout=60)
    listed = yaml.safe_load(out.stdout)
    return {kind: {c["name"] for c in listed.get(kind) or []} for kind in CONTRIB_AND_JAEGER}


# ----------------------------------------------------------------------------- real binaries


@pytest.mark.stack
@pytest.mark.parametrize("config", [COLLECTOR, JAEGER], ids=lambda p: p.name)
def test_jaeger_binary_validates_shipped_config(config: Path) -> None:
    """`jaeger validate` accepts the file with its docker-compose defaults."""
    proc = subprocess.run([str(build_jaeger()), "validate", "--config", f"file:{config}"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert 0 == proc.returncode, proc.stderr[-3000:]


@pytest.mark.stack
def test_gateway_binary_validates_tier1_config() -> None:
    """The loadbalancing tier-1 config loads in the tools/collector distribution."""
    proc = subprocess.run([str(build_gateway_collector()), "validate", "--config", f"file:{GATEWAY_TIER1}"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert 0 == proc.returncode, proc.stderr[-3000:]


@pytest.mark.stack
def test_collector_config_uses_only_components_both_contrib_and_jaeger_have() -> None:
    """The same otel-collector.yaml must run in the contrib image and in the Jaeger binary."""
    jaeger = _binary_components(build_jaeger())
    used = _component_types(_load(COLLECTOR))
    for kind, types in used.items():
        assert set() == types - CONTRIB_AND_JAEGER[kind], f"{kind} not in contrib∩jaeger"
        assert set() == types - jaeger[kind], f"{kind} not compiled into Jaeger v1.76.0"


@pytest.mark.stack
def test_gateway_config_uses_only_contrib_components_the_test_binary_has() -> None:
    gateway = _binary_components(build_gateway_collector())
    for kind, types in _component_types(_load(GATEWAY_TIER1)).items():
        allowed = CONTRIB_AND_JAEGER[kind] | CONTRIB_GATEWAY_EXTRA.get(kind, set())
        assert set() == types - allowed, kind
        assert set() == types - gateway[kind], kind


@pytest.mark.stack
def test_two_tier_gateway_delivers_whole_traces_through_both_tier2_collectors(
        tmp_path: Path) -> None:
    """tier 1 (loadbalancing by traceID) -> 2 x tier 2 (otel-collector.yaml) -> Jaeger."""
    backend = OtelStack.start(TEST_SAMPLING, log_dir=tmp_path)
    try:
        gateway = GatewayStack.start(backend)
        try:
            service = f"gateway-{uuid.uuid4().hex[:8]}"
            run = run_app("sampling", {
                "LLMTRACE_SERVICE_NAME": service, "LLMTRACE_EXPORTER": "otlp",
                "LLMTRACE_ENDPOINT": gateway.otlp_grpc_endpoint, "APP_FAST_TRACES": "40",
                "APP_ENGINE_WINDOWS": "0",
            })
            result = run.result
            sent = set(result["fast"]) | {result["error"], result["slow"], result["high_ttft"]}
            backend.find_traces(service, semconv.SPAN_REQUEST, min_traces=len(sent), timeout_s=60)
            time.sleep(1.0)
            kept = by_trace(backend.query_traces(service))
            assert sent == set(kept)
            assert {5} == {len(spans) for spans in kept.values()}, "no trace split across tier-2 collectors"
            accepted = gateway.tier2_accepted_spans()
            assert all(count > 0 for count in accepted), accepted
            assert 5 * len(sent) == sum(accepted)
        finally:
            gateway.stop()
    finally:
        backend.stop()


# ----------------------------------------------------------------------------- config content


@pytest.mark.parametrize("config", [COLLECTOR, JAEGER, GATEWAY_TIER1], ids=lambda p: p.name)
def test_every_env_reference_has_a_default(config: Path) -> None:
    """docker-compose runs the files with no environment: each ${env:X} needs a :-default."""
    missing = [m.group(1) for m in ENV_REF.finditer(config.read_text()) if m.group(2) is None]
    assert [] == missing


def test_every_variable_the_test_stack_sets_exists_in_the_configs() -> None:
    """A misspelt override would silently do nothing; every name the tests set must be in a file."""
    stack_source = (REPO_ROOT / "scripts" / "otel_stack" / "stack.py").read_text()
    tests_source = (REPO_ROOT / "tests" / "test_e2e_jaeger.py").read_text()
    pattern = r'"(LLMTRACE_(?:COLLECTOR|JAEGER|GATEWAY)_[A-Z0-9_]+)"'
    set_names = set(re.findall(pattern, stack_source + tests_source))
    defined = {m.group(1) for path in (COLLECTOR, JAEGER, GATEWAY_TIER1)
               for m in ENV_REF.finditer(path.read_text())}
    assert set() == set_names - defined
    assert set_names, "the regex found nothing: the test would prove nothing"


def test_tail_sampling_policies_key_on_semconv_names() -> None:
    """The policies name llm.request, llm.engine and the TTFT attribute exactly as semconv does."""
    policies = {p["name"]: p for p in _load(COLLECTOR)["processors"]["tail_sampling"]["policies"]}
    assert {"errors", "slow", "high-ttft", "engine-windows", "baseline"} == set(policies)
    assert ["ERROR"] == policies["errors"]["status_code"]["status_codes"]
    ttft = policies["high-ttft"]["ottl_condition"]["span"][0]
    assert f'name == "{semconv.SPAN_REQUEST}"' in ttft
    assert f'attributes["{semconv.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN}"]' in ttft
    engine = policies["engine-windows"]["and"]["and_sub_policy"][0]["ottl_condition"]["span"]
    assert [f'name == "{semconv.SPAN_ENGINE}"'] == engine
    regex = re.search(r'IsMatch\(name, "(.+)"\)', policies["baseline"]["and"]["and_sub_policy"][0]
                      ["ottl_condition"]["span"][0]).group(1).replace("\\\\", "\\")
    engine_spans = {semconv.SPAN_ENGINE, semconv.SPAN_STEP, *semconv.STEP_CHILD_SPANS, semconv.SPAN_GC,
                    semconv.SPAN_LAYER}
    assert all(re.fullmatch(regex, name) for name in engine_spans), regex
    assert not any(re.fullmatch(regex, name) for name in (semconv.SPAN_REQUEST, *semconv.REQUEST_PHASE_SPANS))


# ----------------------------------------------------------------------------- docker-compose


def _compose() -> dict[str, Any]:
    return _load(COMPOSE)


def test_compose_has_the_four_services_with_pinned_images() -> None:
    services = _compose()["services"]
    assert {"collector", "jaeger", "prometheus", "grafana"} == set(services)
    for name, service in services.items():
        image = service["image"]
        assert ":" in image and not image.endswith((":latest", ":main")), f"{name}: {image} is not pinned"


def test_compose_images_match_the_versions_the_tests_build() -> None:
    """Contrib image = the contrib version Jaeger compiles in; Jaeger image = the module built here."""
    gomod = (REPO_ROOT / "tools" / "jaeger" / "go.mod").read_text()
    contrib = re.search(r"opentelemetry-collector-contrib/processor/tailsamplingprocessor v(\S+)", gomod)
    jaeger_module = re.search(r"github.com/jaegertracing/jaeger (v\S+)", gomod)
    assert contrib and jaeger_module
    services = _compose()["services"]
    assert f"otel/opentelemetry-collector-contrib:{contrib.group(1)}" == services["collector"]["image"]
    jaeger_tag = JAEGER_IMAGE_FOR_MODULE[jaeger_module.group(1)]
    assert f"jaegertracing/jaeger:{jaeger_tag}" == services["jaeger"]["image"]


@pytest.mark.parametrize("compose", [COMPOSE, GATEWAY_COMPOSE], ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_compose_files_mount_files_that_exist_and_pin_images(compose: Path) -> None:
    for name, service in _load(compose)["services"].items():
        for volume in service.get("volumes", []):
            host = volume.split(":", 1)[0]
            assert (compose.parent / host).exists(), f"{name} mounts missing {host}"
        assert not service["image"].endswith(":latest") and ":" in service["image"], name


def test_compose_runs_the_shipped_configs() -> None:
    services = _compose()["services"]
    mount = "./collector/otel-collector.yaml:/etc/llmtrace/otel-collector.yaml:ro"
    assert mount in services["collector"]["volumes"]
    assert "/etc/llmtrace/otel-collector.yaml" in services["collector"]["command"]
    assert "/etc/llmtrace/jaeger.yaml" in services["jaeger"]["command"]


def test_compose_publishes_the_ports_the_configs_listen_on() -> None:
    text = COLLECTOR.read_text()
    for var, port in (("LLMTRACE_COLLECTOR_OTLP_GRPC_ENDPOINT", "4317"),
                      ("LLMTRACE_COLLECTOR_OTLP_HTTP_ENDPOINT", "4318"),
                      ("LLMTRACE_COLLECTOR_PROMETHEUS_ENDPOINT", "8889")):
        assert f"${{env:{var}:-0.0.0.0:{port}}}" in text
        assert f"{port}:{port}" in _compose()["services"]["collector"]["ports"]
    assert "${env:LLMTRACE_JAEGER_QUERY_HTTP_ENDPOINT:-0.0.0.0:16686}" in JAEGER.read_text()
    assert "16686:16686" in _compose()["services"]["jaeger"]["ports"]
    environment = _compose()["services"]["collector"]["environment"]
    assert "jaeger:4317" == environment["LLMTRACE_COLLECTOR_JAEGER_ENDPOINT"]


def test_prometheus_scrapes_the_collector_exporter() -> None:
    config = _load(REPO_ROOT / "deploy" / "prometheus.yml")
    targets = {t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert "collector:8889" in targets


def test_grafana_provisioning_points_at_the_mounted_dashboard_and_datasource() -> None:
    provider = _load(REPO_ROOT / "deploy" / "grafana" / "provisioning" / "dashboards" / "dashboards.yaml")
    path = provider["providers"][0]["options"]["path"]
    assert f"./deploy/grafana/dashboards:{path}:ro" in _compose()["services"]["grafana"]["volumes"]
    datasources = _load(REPO_ROOT / "deploy" / "grafana" / "provisioning" / "datasources"
                        / "datasources.yaml")
    uids = {d["uid"] for d in datasources["datasources"]}
    dashboard = json.loads(DASHBOARD.read_text())
    assert {p["datasource"]["uid"] for p in dashboard["panels"]} <= uids
    urls = {d["uid"]: d["url"] for d in datasources["datasources"]}
    assert "http://prometheus:9090" == urls["prometheus"]


# ----------------------------------------------------------------------------- dashboard names

#: (instrument kind, unit) of each llmtrace metric, as llmtrace.lifecycle.metrics and llmtrace.gpu create them.
METRIC_SHAPES = {
    semconv.METRIC_TTFT: ("histogram", "s"),
    semconv.METRIC_TPOT: ("histogram", "s"),
    semconv.METRIC_REQUEST_DURATION: ("histogram", "s"),
    semconv.METRIC_QUEUE_TIME: ("histogram", "s"),
    semconv.METRIC_BATCH_SIZE: ("histogram", "{request}"),
    semconv.METRIC_GPU_IDLE_RATIO: ("gauge", "1"),
    semconv.METRIC_DROPPED_SPANS: ("counter", "{span}"),
    semconv.HW_GPU_UTILIZATION: ("gauge", "1"),
}
_UNIT_WORDS = {"s": "seconds", "ms": "milliseconds", "By": "bytes", "W": "watts", "J": "joules"}


def prometheus_name(name: str, kind: str, unit: str) -> str:
    """The collector prometheus exporter's normalisation (pkg.translator.prometheus.NormalizeName on)."""
    base = re.sub(r"[^a-zA-Z0-9_]", "_", name)
    if (word := _UNIT_WORDS.get(unit)) and not base.endswith(word):
        base += f"_{word}"
    if unit == "1" and kind == "gauge" and not base.endswith("_ratio"):
        base += "_ratio"
    if kind == "counter":
        base += "_total"
    return base


def _series_names() -> set[str]:
    names = {"traces_span_metrics_calls_total", "target_info"}
    names |= {f"traces_span_metrics_duration_milliseconds{s}" for s in ("_bucket", "_sum", "_count")}
    for metric, (kind, unit) in METRIC_SHAPES.items():
        base = prometheus_name(metric, kind, unit)
        names |= {base + s for s in ("_bucket", "_sum", "_count")} if kind == "histogram" else {base}
    return names


PROMQL_WORDS = {"histogram_quantile", "sum", "by", "rate", "le", "avg", "max", "min", "job", "status_code",
                "span_name", "irate", "increase", "without", "on", "ignoring", "count"}


def _expr_metric_names(expr: str) -> set[str]:
    no_strings = re.sub(r'"[^"]*"', '""', expr)
    no_labels = re.sub(r"\{[^}]*\}", "", no_strings)
    no_ranges = re.sub(r"\[[^\]]*\]", "", no_labels)
    tokens = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", no_ranges))
    return {t for t in tokens if t not in PROMQL_WORDS}


def test_dashboard_is_valid_json_with_the_required_panels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    titles = " | ".join(p["title"] for p in dashboard["panels"])
    for needed in ("TTFT", "TPOT", "Queue time", "Batch size", "GPU utilisation"):
        assert needed in titles
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


def test_dashboard_queries_only_metrics_llmtrace_and_the_collector_export() -> None:
    """Each PromQL metric name is a semconv metric as the Prometheus exporter renders it."""
    dashboard = json.loads(DASHBOARD.read_text())
    known = _series_names()
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dashboard["templating"]["list"]]
    used = set().union(*(_expr_metric_names(e) for e in exprs)) - {"label_values"}
    assert set() == used - known
    assert prometheus_name(semconv.METRIC_TTFT, "histogram", "s") + "_bucket" in used
    expected = "gen_ai_server_time_to_first_token_seconds"
    assert expected == prometheus_name(semconv.METRIC_TTFT, "histogram", "s")
