"""The OpenTelemetry setup llmtrace owns: providers and sampler (``providers``), the span
processors and exporters with their drop accounting (``export``), llmtrace's OTLP/JSON
encoder (``otlp_json``), the pre-aggregated histograms merged into the SDK's metric export
(``histogram``), and the GIL hand-back its background threads use (``gil``).

Below the lifecycle core and the integrations; imports neither.
"""
