"""Every patch target exists in the installed vLLM with the parameters the wrappers read by name."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import wrapt

from llmtrace.integrations._targets import Target, version_supported
from llmtrace.integrations.vllm import _constants as C
from llmtrace.integrations.vllm.patch import VllmInstrumentor, check_targets
from tests.vllm.conftest import driven, requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]


@pytest.mark.parametrize("target", C.TARGETS, ids=lambda t: f"{t.module}:{t.path}")
def test_target_exists_with_expected_parameters(vllm_module: Any, target: Target) -> None:
    """The method is there and its signature names every parameter the adapter binds."""
    _parent, _attribute, original = wrapt.resolve_path(target.module, target.path)
    parameters = set(inspect.signature(original).parameters)
    assert set(target.params) <= parameters, f"{target.path}: {sorted(parameters)}"


def test_check_targets_reports_no_problem(vllm_module: Any) -> None:
    """The all-or-nothing check passes for the installed version, for every target."""
    checked, problems = check_targets()
    assert [] == problems
    assert len(C.TARGETS) == len(checked)
    driven(f"target check: {len(checked)} methods of vllm {vllm_module.__version__} resolved and signature-checked")


def test_installed_version_is_in_the_declared_range(vllm_module: Any) -> None:
    """The installed vLLM is inside ``SUPPORTED`` (CI pins it; a bump must revisit the targets)."""
    version = VllmInstrumentor.installed_version()
    assert version_supported(version, C.SUPPORTED_MIN, C.SUPPORTED_MAX_EXCLUSIVE), version
