"""Build the stack's Go binaries once per version and cache them outside the clone.

Jaeger v2 comes from ``tools/jaeger/go.mod`` (``tool github.com/jaegertracing/jaeger/cmd/jaeger``,
module v1.76.0); the gateway-tier collector from ``tools/collector`` (a minimal
OpenTelemetry Collector distribution with the loadbalancing exporter). Both go.sum
files are committed, so a build needs only the Go module proxy.

promtool (``promtool test rules`` for deploy/prometheus/alerts.yml) from ``tools/promtool/go.mod``
(``tool github.com/prometheus/prometheus/cmd/promtool``, module v0.316.0) the same way.

Cache: ``${LLMTRACE_CACHE:-~/.cache/llmtrace}/jaeger-v1.76.0/jaeger``,
``.../otelcol-lb-v0.140.1-<hash of tools/collector>/otelcol-lb`` and
``.../promtool-v0.316.0/promtool``.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
JAEGER_MODULE_VERSION = "v1.76.0"
JAEGER_PACKAGE = "github.com/jaegertracing/jaeger/cmd/jaeger"
GATEWAY_COLLECTOR_VERSION = "v0.140.1"  # opentelemetry-collector-contrib, the version Jaeger v1.76.0 uses
#: promtool for the alert-rule unit tests (deploy/prometheus/alerts.yml), from ``tools/promtool``;
#: Prometheus 3.x publishes its Go module as v0.3xx (v0.316.0 is Prometheus 3.16).
PROMTOOL_MODULE_VERSION = "v0.316.0"
PROMTOOL_PACKAGE = "github.com/prometheus/prometheus/cmd/promtool"

# A cold build of Jaeger on 2 cores takes ~8 minutes; a wedged `go` should not hang CI forever.
BUILD_TIMEOUT_S = 45 * 60


class StackError(RuntimeError):
    """The test stack could not be built or started; the message says what to do."""


def cache_dir() -> Path:
    return Path(os.environ.get("LLMTRACE_CACHE") or Path.home() / ".cache" / "llmtrace").expanduser()


def jaeger_path() -> Path:
    return cache_dir() / f"jaeger-{JAEGER_MODULE_VERSION}" / "jaeger"


def _tree_hash(directory: Path) -> str:
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum", "main.go"):
        digest.update((directory / name).read_bytes())
    return digest.hexdigest()[:12]


def gateway_collector_path() -> Path:
    tree = REPO_ROOT / "tools" / "collector"
    return cache_dir() / f"otelcol-lb-{GATEWAY_COLLECTOR_VERSION}-{_tree_hash(tree)}" / "otelcol-lb"


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise StackError(
            "the Go toolchain (>= 1.24) is needed to build the test stack (Jaeger v2 from the Go "
            "module proxy) and was not found on PATH; install Go, or run .ci/run which does everything"
        )
    return go


def _build(target: Path, module_dir: Path, package: str, log_name: str) -> Path:
    """``go build`` *package* from *module_dir* into *target*, once, under a file lock."""
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a parallel test worker waits for the first build
        if target.exists():
            return target
        go = _go()
        env = {**os.environ, "GOFLAGS": "-buildvcs=false", "CGO_ENABLED": "0"}
        tmp = target.with_suffix(".tmp")
        log_path = target.parent / log_name
        started = time.monotonic()
        with open(log_path, "w") as log:
            proc = subprocess.run([go, "build", "-trimpath", "-o", str(tmp), package], cwd=module_dir,
                                  env=env, stdout=log, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S,
                                  check=False)
        if proc.returncode != 0:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise StackError(f"go build {package} failed (exit {proc.returncode}); log {log_path}:\n{tail}")
        tmp.replace(target)
        (target.parent / "build-seconds").write_text(f"{time.monotonic() - started:.1f}\n")
    return target


def build_jaeger() -> Path:
    """The cached Jaeger v2 binary, built from ``tools/jaeger`` if missing."""
    return _build(jaeger_path(), REPO_ROOT / "tools" / "jaeger", JAEGER_PACKAGE, "build.log")


def build_gateway_collector() -> Path:
    """The cached gateway-tier collector (otlp + loadbalancing), built from ``tools/collector``."""
    return _build(gateway_collector_path(), REPO_ROOT / "tools" / "collector", ".", "build.log")


def promtool_path() -> Path:
    """The cached build, else a ``promtool`` on PATH (Debian's ``prometheus`` package, which
    ``.ci/run setup`` installs: a cold Go build of promtool takes 15-30 min on 2 cores)."""
    cached = cache_dir() / f"promtool-{PROMTOOL_MODULE_VERSION}" / "promtool"
    if not cached.exists() and (found := shutil.which("promtool")):
        return Path(found)
    return cached


def build_promtool() -> Path:
    """A promtool binary (:func:`promtool_path`), built from ``tools/promtool`` if there is none."""
    return _build(promtool_path(), REPO_ROOT / "tools" / "promtool", PROMTOOL_PACKAGE, "build.log")
