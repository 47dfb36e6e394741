"""A tiny, fully local tokenizer and GPT-2 for tests, demos and benchmarks.

Nothing is downloaded: the BPE tokenizer is trained in-process on a small
built-in corpus (deterministically) and wrapped as a transformers
``PreTrainedTokenizerFast``; the model is a randomly initialised GPT-2 built
from a config. Both need the ``transformers`` extra.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

_CORPUS = (
    "The quick brown fox jumps over the lazy dog.",
    "An inference server receives a request, tokenizes the prompt and waits in a queue.",
    "The scheduler batches requests; the model runs a forward pass on the GPU.",
    "Prefill processes the whole prompt, then decode produces one token per step.",
    "Time to first token, time per output token and inter-token latency describe streaming.",
    "OpenTelemetry spans carry the request metadata to a collector and on to Jaeger.",
    "Hello world! Tracing large language model serving, one request at a time.",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000 tokens, batches, steps, windows, devices.",
)
SPECIAL_TOKENS = ("<|endoftext|>", "<pad>")


def _corpus() -> list[str]:
    # Repeat with small variations so that BPE sees enough pair statistics.
    return [f"{line} {i}" for i in range(20) for line in _CORPUS]


def train_tokenizer(vocab_size: int = 512, cache_dir: str | os.PathLike[str] | None = None) -> Any:
    """A byte-level BPE tokenizer trained on the built-in corpus, as ``PreTrainedTokenizerFast``.

    Deterministic for a given *vocab_size*. With *cache_dir*, the trained
    ``tokenizer.json`` is stored there and reused on the next call.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    cached = Path(cache_dir) / f"tiny-bpe-{vocab_size}.json" if cache_dir is not None else None
    if cached is not None and cached.exists():
        raw = Tokenizer.from_file(str(cached))
    else:
        raw = Tokenizer(models.BPE())
        raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        raw.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
        raw.train_from_iterator(_corpus(), trainer=trainer)
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(f".{os.getpid()}.tmp")
            raw.save(str(tmp))
            os.replace(tmp, cached)
    fast: Any = PreTrainedTokenizerFast  # transformers' stubs leave the constructor untyped
    return fast(tokenizer_object=raw, eos_token=SPECIAL_TOKENS[0], bos_token=SPECIAL_TOKENS[0],
                pad_token=SPECIAL_TOKENS[1])


def build_gpt2(vocab_size: int, n_layer: int = 2, n_embd: int = 64, n_head: int = 2, seed: int = 0,
               eos_token_id: int = 0, pad_token_id: int = 1) -> Any:
    """A randomly initialised GPT-2 (``GPT2LMHeadModel``) in eval mode; same *seed*, same weights."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=vocab_size, n_layer=n_layer, n_embd=n_embd, n_head=n_head,
                        n_positions=512, bos_token_id=eos_token_id, eos_token_id=eos_token_id,
                        pad_token_id=pad_token_id)
    model_class: Any = GPT2LMHeadModel
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = model_class(config)
    finally:
        torch.random.set_rng_state(state)
    model.eval()
    model.generation_config.pad_token_id = pad_token_id
    return model
