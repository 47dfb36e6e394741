"""Run :mod:`tests.stack.app` in a fresh interpreter and parse what it printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scripts.otel_stack.binaries import REPO_ROOT

APP_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class AppRun:
    result: dict[str, Any]
    stderr: str


def run_app(scenario: str, env: Mapping[str, str], timeout_s: float = APP_TIMEOUT_S) -> AppRun:
    """``python -m tests.stack.app SCENARIO`` with *env* over a scrubbed copy of ours."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LLMTRACE_"))}
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), str(REPO_ROOT / "src"),
                                                       base.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "tests.stack.app", scenario], env={**base, **env},
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise AssertionError(f"app {scenario!r} exited {proc.returncode}\nstdout:\n{proc.stdout}\n"
                             f"stderr:\n{proc.stderr[-4000:]}")
    return AppRun(result=json.loads(proc.stdout.strip().splitlines()[-1]), stderr=proc.stderr)
