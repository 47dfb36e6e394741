"""Options, environment variables and their validation (src/llmtrace/config.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmtrace.config import OPTIONS, _choice, markdown_table, resolve
from llmtrace.errors import ConfigError

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_every_option_has_an_environment_variable_named_after_it() -> None:
    """Option ``exporter`` <-> ``LLMTRACE_EXPORTER``, and so on for every option."""
    for option in OPTIONS:
        assert "LLMTRACE_" + option.name.upper() == option.env


def test_keyword_beats_llmtrace_env_beats_otel_env() -> None:
    """Precedence: kwargs, then LLMTRACE_*, then OTEL_*, then the default."""
    env = {"LLMTRACE_SERVICE_NAME": "from-llmtrace", "OTEL_SERVICE_NAME": "from-otel"}
    assert "from-kwarg" == resolve({"service_name": "from-kwarg"}, env).service_name
    assert "from-llmtrace" == resolve({}, env).service_name
    assert "from-otel" == resolve({}, {"OTEL_SERVICE_NAME": "from-otel"}).service_name
    assert "llm-service" == resolve({}, {}).service_name


def test_standard_otel_variables_are_honoured() -> None:
    """Endpoint, protocol, headers and the sampler come from the OTEL_* variables."""
    settings = resolve({}, {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_HEADERS": "api-key=secret,tenant=a",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.25",
        "OTEL_BSP_SCHEDULE_DELAY": "5000",
        "OTEL_METRIC_EXPORT_INTERVAL": "60000",
    })
    assert "http://collector:4318" == settings.endpoint
    assert (5.0, 60.0) == (settings.span_export_interval_s, settings.metrics_interval_s)  # milliseconds there
    assert "http/protobuf" == settings.protocol
    assert {"api-key": "secret", "tenant": "a"} == settings.headers
    assert 0.25 == settings.sample_ratio
    assert "otlp" == settings.exporter  # an endpoint and no exporter: OTLP


def test_no_endpoint_means_the_embedded_file() -> None:
    """With no endpoint configured the default exporter is the OTLP-JSON-lines file."""
    settings = resolve({}, {})
    assert "file" == settings.exporter
    assert "llmtrace-traces.jsonl" == settings.export_file


def test_several_exporters_can_be_combined() -> None:
    """``file:PATH,otlp`` exports to both."""
    settings = resolve({"exporter": "file:/tmp/x.jsonl,otlp"}, {})
    assert ["file:/tmp/x.jsonl", "otlp"] == settings.exporters
    assert "/tmp/x.jsonl" == settings.export_file


@pytest.mark.parametrize(("value", "expected"), [
    (True, "on"), (False, "off"), ("true", "on"), ("false", "off"), ("1", "on"), ("0", "off"),
    ("yes", "on"), ("no", "off"), (" On ", "on"), ("auto", "auto"),
])
def test_a_boolean_means_on_or_off_for_a_choice_that_has_them(value: object, expected: str) -> None:
    """``instrument(gpu=True)`` is ``gpu="on"``: a choice that includes on/off reads booleans and
    their spellings (true/false, 1/0, yes/no) as on/off, from keywords and the environment."""
    assert expected == resolve({"gpu": value}, {}).gpu
    assert expected == resolve({}, {"LLMTRACE_GPU": str(value)}).gpu


def test_any_choice_with_on_and_off_reads_booleans() -> None:
    """Not only ``gpu``: a choice option whose values include on/off reads booleans as on/off;
    one without them (``protocol``) still refuses a boolean."""
    parse = _choice("off", "on", "verbose")
    assert ("on", "off", "verbose") == (parse("x", True), parse("x", "0"), parse("x", "verbose"))
    with pytest.raises(ConfigError, match=r"protocol: True is not one of grpc, http/protobuf, http/json$"):
        resolve({"protocol": True}, {})


@pytest.mark.parametrize(("options", "env", "message"), [
    ({"servce_name": "x"}, {}, r"unknown option 'servce_name' \(allowed: .*service_name"),
    ({"protocol": "udp"}, {}, r"protocol: 'udp' is not one of grpc, http/protobuf"),
    ({}, {"LLMTRACE_PROTOCOL": "udp"}, r"LLMTRACE_PROTOCOL: 'udp' is not one of grpc, http/protobuf"),
    ({"gpu": "maybe"}, {}, r"gpu: 'maybe' is not one of auto, on, off \(or a boolean for on/off: true, false"),
    ({}, {"LLMTRACE_SAMPLE_RATIO": "1.5"}, r"LLMTRACE_SAMPLE_RATIO: '1.5' is outside the allowed range \[0.0, 1.0\]"),
    ({}, {"LLMTRACE_CAPTURE_CONTENT": "maybe"}, r"LLMTRACE_CAPTURE_CONTENT: 'maybe' is not a boolean"),
    ({"exporter": "kafka"}, {}, r"exporter: 'kafka' is not one of otlp, file:PATH, file, console, none"),
    ({"integrations": "torch,tensorflow"}, {}, r"unknown integration 'tensorflow' \(known: tokenizers"),
    ({}, {"OTEL_TRACES_SAMPLER": "jaeger_remote"}, r"OTEL_TRACES_SAMPLER: 'jaeger_remote' is not one of"),
    ({}, {"OTEL_EXPORTER_OTLP_HEADERS": "novalue"}, r"'novalue' is not key=value"),
    ({}, {"OTEL_BSP_SCHEDULE_DELAY": "5s"}, r"OTEL_BSP_SCHEDULE_DELAY: '5s' is not a number of milliseconds"),
    ({}, {"OTEL_METRIC_EXPORT_INTERVAL": "0"},
     r"OTEL_METRIC_EXPORT_INTERVAL \(in seconds\): '0.0' is outside the allowed range \[0.1, 3600.0\]"),
])
def test_bad_input_names_the_option_and_the_allowed_values(options: dict[str, str], env: dict[str, str],
                                                           message: str) -> None:
    """One clear error naming the option (or variable) and what is allowed."""
    with pytest.raises(ConfigError, match=message):
        resolve(options, env)


def test_configuration_doc_lists_every_option() -> None:
    """docs/configuration.md carries the generated table (regenerate: python -m llmtrace.config)."""
    text = DOCS.read_text()
    assert markdown_table() in text
    assert set(re.findall(r"`(LLMTRACE_[A-Z_]+)`", text)) >= {o.env for o in OPTIONS}

