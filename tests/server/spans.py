"""Reading a scenario's exported spans for assertions (through the analyzer's own loader)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmtrace.analysis.model import Span
from llmtrace.analysis.sources import load_spans

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


@dataclass
class Run:
    spans: list[Span]
    result: dict[str, Any]
    by_id: dict[str, Span] = field(init=False)

    def __post_init__(self) -> None:
        self.by_id = {s.span_id: s for s in self.spans}

    def named(self, name: str) -> list[Span]:
        return [s for s in self.spans if s.name == name]

    def children(self, parent: Span, name: str | None = None) -> list[Span]:
        return [s for s in self.spans if s.parent_id == parent.span_id and s.trace_id == parent.trace_id
                and (name is None or s.name == name)]


def run_scenario(script: str, out: Path, *args: str, env: dict[str, str] | None = None,
                 timeout_s: float = 240) -> dict[str, Any]:
    """Run ``tests/scenarios/<script>`` in a fresh interpreter; return the JSON it printed last."""
    proc = subprocess.run([sys.executable, str(SCENARIOS / script), str(out), *args], capture_output=True,
                          text=True, timeout=timeout_s, env={**os.environ, **(env or {})}, check=False)
    assert proc.returncode == 0, f"scenario {script} failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def load_run(script: str, out: Path, *args: str, env: dict[str, str] | None = None) -> Run:
    result = run_scenario(script, out, *args, env=env)
    return Run(list(load_spans(str(out)).spans), result)
