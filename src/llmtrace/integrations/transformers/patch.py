"""Wiring of the ``transformers`` integration.

Each target is patched when the submodule defining it is imported (transformers
loads lazily), so a process that only tokenizes never imports torch because of us.
"""

from __future__ import annotations

import contextvars
import functools
import weakref
from typing import Any

from llmtrace._safety import guarded, warn_once
from llmtrace.integrations import _common
from llmtrace.integrations._base import Instrumentor
from llmtrace.integrations.transformers import _constants, continuous, extractors, generate


def _count_encoding(result: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, int]:
    return extractors.encoding_counts(result)


def _count_decode(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    return extractors.ids_count(_common.first_argument(args, kwargs, "token_ids"))


def _count_batch_decode(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    return extractors.ids_count(_common.first_argument(args, kwargs, "sequences"))


@guarded("transformers.post_init")
def _hook_new_model(model: Any) -> None:
    from llmtrace.integrations.torch import patch as torch_patch

    if torch_patch.hook_model(model, always=False):
        _models.add(model)


def _post_init_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    result = wrapped(*args, **kwargs)
    _hook_new_model(instance)
    return result


_models: weakref.WeakSet[Any] = weakref.WeakSet()


def _submit_in_context(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not args or not callable(args[0]):
        return wrapped(*args, **kwargs)
    return wrapped(functools.partial(contextvars.copy_context().run, args[0]), *args[1:], **kwargs)


class TransformersInstrumentor(Instrumentor):
    name = "transformers"
    trigger = _constants.MODULE
    distribution = _constants.DISTRIBUTION
    supported = _constants.SUPPORTED

    def _patch(self) -> None:
        self.patch_on_import({
            _constants.TOKENIZER_MODULE: self._patch_tokenizers,
            _constants.MODELING_MODULE: self._patch_modeling,
            _constants.GENERATION_MODULE: self._patch_generation,
            _constants.STREAMERS_MODULE: self._patch_streamers,
            continuous.API_MODULE: self._patch_continuous_batching,
            _constants.SERVING_MODULE: self._patch_serving,
        })

    def _patch_tokenizers(self) -> None:
        for path, text_param in _constants.ENCODE_METHODS:
            self.patches.replace(_constants.TOKENIZER_MODULE, path, _common.encode_method(_count_encoding, text_param))
        decode, batch_decode = _constants.DECODE_METHODS
        self.patches.replace(_constants.TOKENIZER_MODULE, decode, _common.decode_method(_count_decode))
        self.patches.replace(_constants.TOKENIZER_MODULE, batch_decode, _common.decode_method(_count_batch_decode))

    def _patch_modeling(self) -> None:
        self.patches.wrap(_constants.MODELING_MODULE, _constants.POST_INIT, _post_init_wrapper)

    def _patch_generation(self) -> None:
        self.patches.wrap(_constants.GENERATION_MODULE, _constants.GENERATE, generate.generate_wrapper)

    def _patch_streamers(self) -> None:
        self.patches.wrap(_constants.STREAMERS_MODULE, _constants.STREAMER_INIT, generate.streamer_init_wrapper)

    def _patch_serving(self) -> None:
        # transformers serve runs generate() on one persistent inference thread fed by a queue:
        # the submitted call carries the handler's context there, so its request joins the
        # handler's trace and server call (as a TextStreamer does for a plain Thread).
        for method in _constants.SERVING_SUBMIT:
            self.patches.wrap(_constants.SERVING_MODULE, method, _submit_in_context)

    def _patch_continuous_batching(self) -> None:
        # All or nothing: these are library internals, and a half-patched engine would open
        # requests that nothing ends.
        if missing := self.patches.wrap_all(continuous.TARGETS):
            warn_once("transformers-cb-targets", "llmtrace: this transformers' continuous batching lacks %s; "
                      "not tracing it (requests through generate() still are)", ", ".join(missing))
            return
        # Prefix-sharing provenance is extra: a transformers without it is traced all the same.
        self.patches.wrap(continuous.CACHE_MODULE, continuous.PREFIX_MATCH, continuous.prefix_match_wrapper)

    def _unpatch(self) -> None:
        from llmtrace.integrations.torch import patch as torch_patch

        for model in list(_models):
            torch_patch.unhook_model(model)
        _models.clear()
