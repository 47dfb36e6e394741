"""Wiring of the SGLang adapter: the all-or-nothing target check and the instrumentor.

The hooks live in :mod:`._api` (HTTP server + TokenizerManager), :mod:`._engine`
(Scheduler) and :mod:`._detokenizer` (DetokenizerManager, and the carrier on SGLang's
time stats). Every hook calls SGLang first-class: it takes a timestamp, calls
through, and hands the objects to a ``@guarded`` helper that reads them (through
:mod:`.extractors`) into the lifecycle API. SGLang's own exceptions pass through
untouched; an llmtrace error is logged once and counted, never raised.

All targets are patched in every SGLang process (the class patches are cheap, and
which process runs which manager is SGLang's business): a hook only ever fires in
the process whose manager calls it.
"""

from __future__ import annotations

import importlib

from llmtrace.integrations import _targets
from llmtrace.integrations._targets import Checked, HookMaker
from llmtrace.integrations.sglang import _api, _detokenizer, _engine
from llmtrace.integrations.sglang import _constants as C

_HOOKS: dict[str, HookMaker] = {
    "TokenizerManager._init_req_state": _api.init_req_state_hook,
    "TokenizerManager._tokenize_one_request": _api.tokenize_hook,
    "TokenizerManager._handle_batch_output": _api.batch_output_hook,
    "TokenizerManager.abort_request": _api.abort_request_hook,
    "TokenizerManager._handle_abort_req": _api.handle_abort_hook,
    "ReqTimeStatsBase.__getstate__": _detokenizer.getstate_hook,
    "SchedulerReqTimeStats.__getstate__": _detokenizer.getstate_hook,
    "Scheduler.handle_generate_request": _engine.handle_generate_hook,
    "Scheduler.get_next_batch_to_run": _engine.get_next_batch_hook,
    "Scheduler.run_batch": _engine.run_batch_hook,
    "Scheduler.process_batch_result": _engine.process_result_hook,
    "Scheduler.send_abort_output": _engine.send_abort_hook,
    "ScheduleBatch.retract_decode": _engine.retract_hook,
    "SchedulerOutputStreamer.stream_output": _engine.stream_output_hook,
    "DetokenizerManager.handle_batch_token_id_out": _detokenizer.detokenize_hook,
}


def check_targets(targets: tuple[_targets.Target, ...] = C.TARGETS) -> tuple[list[Checked], list[str]]:
    """The shared all-or-nothing check (:func:`llmtrace.integrations._targets.check_targets`) of SGLang's targets."""
    return _targets.check_targets(targets)


class SglangInstrumentor(_targets.EngineInstrumentor):
    """SGLang (``sglang.srt``): request traces in the HTTP server, engine windows per scheduler rank."""

    name = "sglang"
    label = "SGLang"
    trigger = C.TRIGGER
    distribution = C.DISTRIBUTION
    supported = C.SUPPORTED
    targets = C.TARGETS
    supported_min = C.SUPPORTED_MIN
    supported_max_exclusive = C.SUPPORTED_MAX_EXCLUSIVE

    def hook_for(self, checked: Checked) -> HookMaker | None:
        return _HOOKS[checked.target.path]

    def _patch(self) -> None:
        super()._patch()
        # SGLang copies a request's time stats into an object of another class with
        # ``new_from_obj`` (the data-parallel controller on every request), keeping only the
        # attributes the new object already has: a class default of None makes the carried
        # values one of them. (An instance without them still reads as carrying nothing.)
        stats = importlib.import_module(C.TIME_STATS_MODULE).ReqTimeStatsBase
        self.patches.set_attr(stats, C.CARRY_ATTR, None)

    def _unpatch(self) -> None:
        _engine.reset()
        _api.API.reset()
