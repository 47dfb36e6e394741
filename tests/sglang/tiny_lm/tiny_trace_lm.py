"""A real torch language model with random weights that SGLang's CPU path can run.

The seam, and why: SGLang 0.5.23 from PyPI cannot run its own Llama on a CPU (its
rotary embedding imports ``vllm._custom_ops``, and the CPU attention kernels come from a
separate ``sgl-kernel`` CPU build). Everything else is SGLang's own: the HTTP server,
TokenizerManager, Scheduler with its batch formation, radix cache and KV pool,
TpModelWorker, ModelRunner (``--device cpu``, ``torch_native`` attention backend, dummy
weight loading), its LogitsProcessor and sampler, and the DetokenizerManager. This model
replaces only the transformer layers: an embedding, one MLP and SGLang's LM head, so it
never calls attention and every step's forward is a real (small) torch computation.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from torch import nn


class TinyTraceLMForCausalLM(nn.Module):
    def __init__(self, config: Any, quant_config: Any = None, prefix: str = "") -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.mlp = nn.Linear(config.hidden_size, config.hidden_size)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        self.logits_processor = LogitsProcessor(config)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: Any,
                input_embeds: Any = None, get_embedding: bool = False, **kwargs: Any) -> Any:
        hidden = torch.tanh(self.mlp(self.embed_tokens(input_ids)))
        return self.logits_processor(input_ids, hidden, self.lm_head, forward_batch)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return set()  # dummy weights only (--load-format dummy)


EntryClass = TinyTraceLMForCausalLM
