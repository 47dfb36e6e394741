"""The HTML report in a real browser: it renders, logs nothing to the console, shows every chart.

Headless Chromium (Debian's ``chromium``) loads the self-contained file twice: once with
``--dump-dom`` to read the DOM after the script ran, once with ``--screenshot`` to leave
``artifacts/analysis-report.png`` for people to look at. Console output is read from
Chromium's own log (``--enable-logging=stderr``): the report's script never logs, so any
``CONSOLE`` line — an uncaught exception, a CSP violation — fails the test.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from llmtrace.analysis import analyze, build_traceset, to_json
from llmtrace.analysis.report.html import render_html
from llmtrace.analysis.sources import load_spans
from llmtrace.analysis.synthetic import SimConfig, write_jsonl

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts"
EXPECTED_IDS = (
    "summary-cards",
    "bottleneck",
    "timeline-svg",
    "gpu-idle",
    "breakdown-svg",
    "scatter-ttft-svg",
    "scatter-e2e-svg",
    "flame-svg",
    "critical-path",
    "anomalies",
)
_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
)


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("headless Chromium not installed (apt-get install chromium)")


def _run(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [browser, *_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("html")
    traces = tmp / "sim.jsonl.gz"
    write_jsonl(str(traces), SimConfig(duration_s=6, arrival_rate=12))
    loaded = load_spans(str(traces))
    summary = to_json(analyze(build_traceset(loaded.spans), source="simulated server"), include_views=True)
    page = tmp / "report.html"
    page.write_text(render_html(summary), encoding="utf-8")
    return page


def test_report_is_self_contained(report: Path) -> None:
    """No external URL is referenced: no CDN, no fonts, no images from the network."""
    html = report.read_text(encoding="utf-8")
    assert [] == re.findall(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", html)
    assert "default-src 'none'" in html


def test_report_renders_without_console_errors(report: Path, tmp_path: Path) -> None:
    """Chromium runs the script to the end, logs nothing, and every chart element exists."""
    browser = _chromium()
    proc = _run(browser, tmp_path / "profile", "--dump-dom", report.as_uri())
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    assert [] == console
    dom = proc.stdout
    assert 'data-rendered="1"' in dom
    missing = [i for i in EXPECTED_IDS if f'id="{i}"' not in dom]
    assert [] == missing
    assert dom.count('class="forward"') > 10  # forward passes drawn in the timeline
    assert dom.count('class="gap"') > 10  # idle gaps shaded
    assert dom.count('class="pt"') > 20  # scatter points


@pytest.mark.parametrize("keep", ["requests", "engine"])
def test_partial_data_renders_without_errors(keep: str, tmp_path: Path) -> None:
    """Only request traces, or only the engine timeline: the page still renders, empty charts say why."""
    browser = _chromium()
    traces = tmp_path / "sim.jsonl"
    write_jsonl(str(traces), SimConfig(duration_s=2, arrival_rate=8))
    spans = load_spans(str(traces)).spans
    engine_names = {"llm.engine", "llm.step", "llm.schedule", "llm.forward", "llm.sample", "llm.postprocess", "llm.gc"}
    kept = [s for s in spans if (s.name in engine_names) == (keep == "engine")]
    page = tmp_path / "partial.html"
    page.write_text(render_html(to_json(analyze(build_traceset(kept)), include_views=True)), encoding="utf-8")
    proc = _run(browser, tmp_path / "profile", "--dump-dom", page.as_uri())
    assert [] == [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    assert 'data-rendered="1"' in proc.stdout
    assert 'class="empty"' in proc.stdout


def test_prefix_cache_view_plots_ttft_against_the_cached_share(tmp_path: Path) -> None:
    """Requests with prompt provenance: the page draws one point per request in the prefix-cache
    view and states the hit ratio."""
    from tests.analysis.test_prefix_cache import _requests

    browser = _chromium()
    summary = to_json(analyze(build_traceset(_requests([0, 0, 256, 384, 448]))), include_views=True)
    page = tmp_path / "prefix.html"
    page.write_text(render_html(summary), encoding="utf-8")
    proc = _run(browser, tmp_path / "profile", "--dump-dom", page.as_uri())
    assert [] == [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    dom = proc.stdout
    assert 'id="scatter-cached-svg"' in dom
    cached_view = dom[dom.index('id="scatter-cached-svg"'):]
    assert 5 == cached_view[:cached_view.index("</svg>")].count('class="pt"')
    assert "Prefix-cache hit ratio 42.5%" in dom


def test_report_screenshot_is_saved_for_review(report: Path, tmp_path: Path) -> None:
    """A full-page screenshot lands in artifacts/ (gitignored) for people to look at."""
    browser = _chromium()
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "analysis-report.png"
    shot.unlink(missing_ok=True)
    _run(browser, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1400,2000", report.as_uri())
    assert shot.exists()
    assert shot.stat().st_size > 20_000  # a blank page is a few kB
