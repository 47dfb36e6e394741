"""Targets of the ``transformers`` integration."""

from __future__ import annotations

from typing import Final

MODULE: Final = "transformers"
DISTRIBUTION: Final = "transformers"
SUPPORTED: Final = ">=4.40"

#: Submodule -> attributes wrapped there. Each is patched when *that* submodule is
#: imported, so a tokenizer-only process never pays for importing torch.
TOKENIZER_MODULE: Final = "transformers.tokenization_utils_base"
ENCODE_METHODS: Final = (("PreTrainedTokenizerBase.__call__", "text"), ("PreTrainedTokenizerBase.encode", "text"))
DECODE_METHODS: Final = ("PreTrainedTokenizerBase.decode", "PreTrainedTokenizerBase.batch_decode")
MODELING_MODULE: Final = "transformers.modeling_utils"
POST_INIT: Final = "PreTrainedModel.post_init"
GENERATION_MODULE: Final = "transformers.generation.utils"
GENERATE: Final = "GenerationMixin.generate"
STREAMERS_MODULE: Final = "transformers.generation.streamers"
STREAMER_INIT: Final = "TextStreamer.__init__"
#: Attribute set on a streamer: the context it was created in (the handler's).
STREAMER_CONTEXT_ATTR: Final = "_llmtrace_context"
OPERATION: Final = "text_completion"
#: transformers serve's inference thread: calls submitted to it run in the submitter's context.
SERVING_MODULE: Final = "transformers.cli.serving.utils"
SERVING_SUBMIT: Final = ("InferenceThread.submit", "InferenceThread.async_submit")
