"""instrument() before or after vLLM is imported, uninstrument(), instrument() again — each in a fresh process."""

from __future__ import annotations

import subprocess
import textwrap

import pytest

from tests.vllm.conftest import PYTHON, REPO, requires_vllm, subprocess_env

pytestmark = [pytest.mark.vllm, requires_vllm]

CHECK = """
import wrapt
from llmtrace.integrations.vllm import _constants as C

def wrapped():
    found = set()
    for t in C.TARGETS:
        parent, attribute, _ = wrapt.resolve_path(t.module, t.path)
        if getattr(vars(parent).get(attribute), "_self_llmtrace", False):
            found.add(t.path)
    return found

EXPECTED = {t.path for t in C.TARGETS if t.path not in C.CHECK_ONLY}
"""

BEFORE = CHECK + """
import llmtrace
llmtrace.instrument(exporter="none", gpu="off", metrics=False)
import vllm
assert "vllm" in llmtrace.instrument().integrations, llmtrace.instrument().integrations
assert EXPECTED == wrapped(), wrapped()
llmtrace.uninstrument()
assert set() == wrapped()
llmtrace.instrument(exporter="none", gpu="off", metrics=False)
assert EXPECTED == wrapped(), "re-instrument"
print("OK")
"""

AFTER = CHECK + """
import vllm
from vllm.v1.core.sched.scheduler import Scheduler
original = vars(Scheduler)["schedule"]
import llmtrace
llmtrace.instrument(exporter="none", gpu="off", metrics=False)
assert EXPECTED == wrapped(), wrapped()
llmtrace.uninstrument()
assert vars(Scheduler)["schedule"] is original
print("OK")
"""


@pytest.mark.parametrize("script", [BEFORE, AFTER], ids=["instrument-then-import", "import-then-instrument"])
def test_import_order(script: str) -> None:
    done = subprocess.run([PYTHON, "-c", textwrap.dedent(script)], cwd=REPO, env=subprocess_env(),
                          capture_output=True, text=True, timeout=300, check=False)
    assert 0 == done.returncode, done.stderr[-4000:]
    assert "OK" in done.stdout
