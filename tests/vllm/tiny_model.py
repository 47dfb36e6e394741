"""A local model directory for vLLM: a Llama ``config.json`` and a BPE tokenizer trained on the spot.

No hub access: the weights are vLLM's ``load_format="dummy"``. Stdlib + ``tokenizers`` only, so
``scripts/vllm-gpu-check`` can use it from a fresh checkout.
"""

from __future__ import annotations

import json
from pathlib import Path

CORPUS = ["hello world the quick brown fox jumps over the lazy dog", "the lazy dog sleeps", "quick brown fox"]


def build(directory: Path, *, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS * 20, trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": 4096}))
    (directory / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": hidden * 2, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "num_hidden_layers": layers, "vocab_size": tokenizer.get_vocab_size(), "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
        "tie_word_embeddings": False}))
    return directory
