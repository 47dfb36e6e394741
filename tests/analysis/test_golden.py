"""Golden outputs: recorded fixtures must analyse to their recorded summaries.

Fixtures and goldens are written by ``scripts/record-fixtures``; when the analyzer's output
changes on purpose, re-record and review the golden diff.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from llmtrace.analysis import analyze, build_traceset, to_json
from llmtrace.analysis.sources import load_spans

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "analysis"
GOLDENS = sorted(FIXTURES.glob("*.summary.json"))


def _round(obj: Any) -> Any:
    """Compare floats to 9 significant digits (summation order may differ between platforms)."""
    if isinstance(obj, float):
        return obj if obj == 0 or math.isnan(obj) else float(f"{obj:.9g}")
    if isinstance(obj, dict):
        return {k: _round(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_round(v) for v in obj]
    return obj


def test_fixtures_exist() -> None:
    """At least the synthetic and the real-Jaeger fixtures are checked in."""
    assert {"sim_small", "jaeger_v3_response"} <= {p.name.split(".")[0] for p in GOLDENS}


@pytest.mark.parametrize("golden", GOLDENS, ids=lambda p: p.name.split(".")[0])
def test_fixture_matches_golden_summary(golden: Path) -> None:
    """The fixture's summary equals the golden one, key for key."""
    name = golden.name.split(".")[0]
    [fixture] = [p for p in FIXTURES.glob(f"{name}.*.gz")]
    loaded = load_spans(str(fixture))
    got = to_json(analyze(build_traceset(loaded.spans, warnings=loaded.warnings), source=fixture.name))
    got.pop("generator")
    # Warnings name the file by the path it was read from: keep them relative to the fixtures.
    got["source"]["warnings"] = [w.replace(f"{FIXTURES}/", "") for w in got["source"]["warnings"]]
    want = json.loads(golden.read_text())
    assert _round(want) == _round(json.loads(json.dumps(got)))
