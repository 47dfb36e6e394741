"""Run in a fresh interpreter by test_import_order.py: ``python import_order_script.py before|after|between``.

Prints one JSON line: which targets were patched, whether uninstrument restored the
originals by identity, and the span names a small workload produced.
"""

from __future__ import annotations

import json
import sys
from typing import Any

TARGETS = (
    ("tokenizers", "Tokenizer", "encode"),
    ("tokenizers", "Tokenizer", "decode_batch"),
    ("transformers.tokenization_utils_base", "PreTrainedTokenizerBase", "__call__"),
    ("transformers.tokenization_utils_base", "PreTrainedTokenizerBase", "batch_decode"),
    ("transformers.modeling_utils", "PreTrainedModel", "post_init"),
    ("transformers.generation.utils", "GenerationMixin", "generate"),
    ("transformers.generation.streamers", "TextStreamer", "__init__"),
    ("fastapi", "FastAPI", "build_middleware_stack"),
    ("aiohttp.web_app", "Application", "__init__"),
    ("grpc", None, "server"),
)


def _import_all() -> None:
    import importlib

    importlib.import_module("aiohttp.web")  # the aiohttp integration's trigger, as a server imports it
    for module, _, _ in TARGETS:
        importlib.import_module(module)


def _current() -> dict[str, Any]:
    found = {}
    for module, owner, attribute in TARGETS:
        parent = sys.modules[module] if owner is None else getattr(sys.modules[module], owner)
        found[f"{module}:{owner}.{attribute}"] = vars(parent)[attribute]
    return found


def _patched() -> list[str]:

    return sorted(name for name, value in _current().items() if getattr(value, "_self_llmtrace", False))


def _workload(instrument: bool) -> list[str]:
    from opentelemetry import trace

    from llmtrace.testing import capture
    from tests.helpers import tiny_models

    with capture(instrument=instrument) as captured, trace.get_tracer("t").start_as_current_span("work"):
        tokenizer = tiny_models.tokenizer()
        model = tiny_models.fresh_model()
        enc = tokenizer("hello world", return_tensors="pt")
        model.generate(**enc, max_new_tokens=2, do_sample=False)
    return sorted({span.name for span in captured.spans})


def main(order: str) -> None:
    import llmtrace

    result: dict[str, Any] = {}
    if order == "after":
        _import_all()
        originals = _current()
        llmtrace.instrument(exporter="none", gpu="off")
    elif order == "between":  # imported while llmtrace was off: the import hook fired with nothing to do
        llmtrace.instrument(exporter="none", gpu="off")
        llmtrace.uninstrument()
        _import_all()
        llmtrace.instrument(exporter="none", gpu="off")
    else:
        llmtrace.instrument(exporter="none", gpu="off")
        _import_all()
    result["patched"] = _patched()
    llmtrace.uninstrument()
    if order == "after":
        result["restored"] = all(value is originals[name] for name, value in _current().items())
    result["patched_after_uninstrument"] = _patched()
    result["spans_uninstrumented"] = _workload(instrument=False)
    llmtrace.instrument(exporter="none", gpu="off")
    result["patched_again"] = _patched()
    llmtrace.uninstrument()
    result["spans"] = _workload(instrument=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
