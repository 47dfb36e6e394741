"""Synthetic prompts of a requested token length — never real user data.

A prompt is words drawn from a fixed list. How many tokens a word becomes depends on the
server's tokenizer (and a chat template adds its own), so before the load starts the tool
sends two short probes and fits ``prompt_tokens = overhead + slope * words`` to the server's
own ``usage.prompt_tokens`` (:func:`fit_calibration`). Without usage in the answer the tool
assumes one token per word and says so.

Shared prefixes (Mooncake ``hash_ids``): block *b* is always the same text, drawn from a
generator seeded with *b*, so requests that share block ids share a prompt prefix. What
follows the blocks starts with the request's own index, so no two requests share more.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from llmtrace.load.replay import MOONCAKE_BLOCK_TOKENS

#: Common short English words: most tokenizers map each to one token (with its leading space).
_WORD_TEXT = (
    "the of and to in is was for on are with as be at by this from or had not but what all were we when "
    "your can said there use an each which she do how their if will up other about out many then them these "
    "so some her would make like him into time has look two more write go see number no way could people my "
    "than first water been call who oil its now find long down day did get come made may part over new sound "
    "take only little work know place year live me back give most very after thing our just name good sentence "
    "man think say great where help through much before line right too mean old any same tell boy follow came "
    "want show also around form three small set put end does another well large must big even such because "
    "turn here why ask went men read need land different home us move try kind hand picture again change off "
    "play spell air away animal house point page letter mother answer found study still learn should world"
)
WORDS = tuple(_WORD_TEXT.split())
#: Probe sizes in words: far enough apart for a slope, short enough for the smallest context
#: window (the reference server's tiny model has 512 positions).
PROBE_WORDS = (16, 64)


@dataclass(frozen=True)
class Calibration:
    """``prompt_tokens ≈ overhead + tokens_per_word * words`` for this server and endpoint."""

    tokens_per_word: float = 1.0
    overhead_tokens: float = 0.0
    measured: bool = False

    def words_for(self, tokens: int) -> int:
        return max(1, round((tokens - self.overhead_tokens) / self.tokens_per_word))


def fit_calibration(probes: list[tuple[int, int]]) -> Calibration:
    """Fit from (words sent, prompt_tokens reported) pairs; a degenerate fit keeps 1 token/word."""
    if len(probes) < 2:
        return Calibration()
    (w1, t1), (w2, t2) = probes[0], probes[-1]
    if w2 == w1:
        return Calibration()
    slope = (t2 - t1) / (w2 - w1)
    if not 0.2 <= slope <= 10:  # not a tokenizer's ratio: a server that ignores the prompt
        return Calibration()
    return Calibration(tokens_per_word=slope, overhead_tokens=max(0.0, t1 - slope * w1), measured=True)


def words(count: int, rng: random.Random) -> str:
    return " ".join(rng.choices(WORDS, k=count))


class PromptMaker:
    """Prompts for planned requests under one calibration; block texts are cached."""

    def __init__(self, calibration: Calibration, seed: int = 0, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> None:
        if block_tokens < 1:
            raise ValueError(f"prefix block tokens must be positive, not {block_tokens}")
        self.calibration = calibration
        self._seed = seed
        self._blocks: dict[int, str] = {}
        self._block_words = max(1, round(block_tokens / calibration.tokens_per_word))

    def _block(self, block_id: int) -> str:
        text = self._blocks.get(block_id)
        if text is None:
            text = words(self._block_words, random.Random(block_id * 1_000_003 + self._seed))
            self._blocks[block_id] = text
        return text

    def prompt(self, index: int, input_tokens: int, prefix_blocks: tuple[int, ...] = ()) -> str:
        """About *input_tokens* tokens: the shared blocks, then ``index`` and words of its own."""
        total_words = self.calibration.words_for(input_tokens)
        shared = [self._block(b) for b in prefix_blocks][: max(0, total_words // self._block_words)]
        own = max(1, total_words - len(shared) * self._block_words - 1)
        rng = random.Random(index * 7919 + self._seed)
        return " ".join([*shared, str(index), words(own, rng)])
