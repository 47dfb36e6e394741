"""The adapter against the installed SGLang, in-process (in SGLang's environment, tests/sglang/probes.py):
the all-or-nothing target check, the version guard, and the extractors on SGLang's own objects."""

from __future__ import annotations

from typing import Any

import pytest

from llmtrace.integrations.sglang import _constants as C
from tests.sglang.conftest import driven, run_probes

#: A cold SGLang environment (built by the session fixture) plus SGLang's import on two cores.
pytestmark = [pytest.mark.sglang, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def probed(sglang_python: str) -> dict[str, Any]:
    results = run_probes(sglang_python, "targets", "objects")
    driven(f"target check: {results['targets']['checked']} methods of sglang {results['targets']['version']} "
           "resolved and signature-checked; extractors on SGLang's request/output structs, finish reasons, "
           "forward modes and time stats pickled by SGLang")
    return results


def test_every_target_exists_with_the_parameters_the_wrappers_read(probed: dict[str, Any]) -> None:
    """The installed SGLang has every method, with every parameter bound by name; it is in the range."""
    targets = probed["targets"]
    assert [] == targets["problems"]
    assert len(C.TARGETS) == targets["checked"]
    assert "0.5.23" == targets["version"]


def test_instrument_wraps_every_target_and_uninstrument_restores_the_identical_methods(
        probed: dict[str, Any]) -> None:
    targets = probed["targets"]
    assert len(C.TARGETS) == targets["wrapped"]
    assert targets["restored_identical"]


def test_a_changed_signature_turns_the_whole_adapter_off(probed: dict[str, Any]) -> None:
    """One renamed parameter: the problem names it, nothing is wrapped (not half a pipeline)."""
    changed = probed["targets"]["changed_signature"]
    assert not changed["active"]
    assert ["sglang.srt.managers.scheduler.Scheduler.run_batch: parameter(s) batch not in (renamed)"] == \
        changed["problems"]
    assert changed["untouched"]


def test_an_unsupported_version_turns_the_adapter_off(probed: dict[str, Any]) -> None:
    unsupported = probed["targets"]["unsupported_version"]
    assert not unsupported["active"]
    assert [f"version 0.9.0 is outside the supported range {C.SUPPORTED}"] == unsupported["problems"]
    assert unsupported["unchanged"]


def test_request_parameters_from_sglangs_request_structs(probed: dict[str, Any]) -> None:
    objects = probed["objects"]
    single = objects["single_params"]
    assert (7, 0.5, 0.9, True) == (single["max_tokens"], single["temperature"], single["top_p"], single["stream"])
    assert single["request_id"] == objects["single_ids"][0]
    assert 2 == objects["batch_ids"]
    assert ["text_completion", "embeddings"] == objects["operations"]
    assert [3, 4] == objects["batch_max_tokens"]
    assert [3] == objects["engine_request"]  # prompt tokens of a TokenizedGenerateReqInput
    assert (5, 0.5) == (objects["engine_params"]["max_tokens"], objects["engine_params"]["top_p"])


def test_finish_reasons_and_forward_modes(probed: dict[str, Any]) -> None:
    objects = probed["objects"]
    assert ["length", "abort", "stop", "length", None] == objects["finish"]
    assert ["extend", "decode", "mixed", "idle"] == objects["modes"]
    assert (0, 2) == (objects["decode_batch"]["prefill_tokens"], objects["decode_batch"]["decode_tokens"])
    assert (16, 0) == (objects["extend_batch"]["prefill_tokens"], objects["extend_batch"]["decode_tokens"])


def test_the_carrier_crosses_sglangs_own_pickling_and_nothing_else_changes(probed: dict[str, Any]) -> None:
    """Forward: the W3C carrier; back: the engine summary (unknown keys dropped). Time stats without
    llmtrace values pickle exactly as before, and an uninstrumented SGLang carries nothing."""
    objects = probed["objects"]
    carrier = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
    assert carrier == objects["carrier_across"]
    # SGLang's DP controller copies the time stats into its own class, keeping only known attributes.
    assert carrier == objects["carrier_through_dp_controller"]
    assert not objects["class_default_left"]  # uninstrument() removes the class default again
    assert {"queue_s": 0.25, "preemptions": 1} == objects["summary_across"]
    assert objects["plain_state_unchanged"]
    assert not objects["uninstrumented_carries"]
