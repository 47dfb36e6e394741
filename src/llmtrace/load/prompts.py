"""Synthetic prompts of an exact token length — never real user data.

A prompt is a fixed lead word followed by words from a fixed list, separated by spaces.
Tokenizers split text at spaces before they merge (byte-level BPE, SentencePiece, tiktoken),
so a prompt's token count is what the lead word costs (with whatever the server adds around
a prompt: BOS, a chat template) plus what each following word costs on its own. Before the
load starts the tool learns those costs from the server's own ``usage.prompt_tokens``, with
1-token probes (:func:`probe_plan`):

* the lead word alone, then the lead word and every piece (:data:`POOL` and the digits) at
  once; when the pieces add up to one token each — any large-vocabulary tokenizer — that is
  all (two probes);
* otherwise each piece after the lead word on its own (:data:`PIECES` probes, sent a few at a
  time), and one prompt built from the result, checked against the server's count.

A prompt then adds random pieces while more than the costliest one fits, and closes the
count with pieces that fit exactly (one-token pieces always do), so the server counts the
asked length exactly, down to a floor of the lead word and the request's index (a few
tokens). Without usage in the answers every piece counts as one token, and the tool says so.

Shared prefixes (Mooncake ``hash_ids``): block *b* is always the same text of exactly the
block's tokens, drawn from a generator seeded with *b*, so requests that share block ids share
a prompt prefix. After the blocks comes the request's index in spaced digits (``4 0 7``), so
no two requests share more.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from llmtrace.load.replay import MOONCAKE_BLOCK_TOKENS

#: The words prompts are made of (index digits aside): common short English words, which
#: large-vocabulary tokenizers map to one token each (with the leading space); few enough that
#: all of them in one probe fit the smallest context window (the reference server's tiny
#: model has 512 positions).
_POOL_TEXT = (
    "the of and to in is was for on are with as be at by this from or had not but what all were we when "
    "your can said there use an each which she do how their if will up other about out many then them these "
    "so some her would make like him into time has look two more write"
)
POOL = tuple(_POOL_TEXT.split())
#: Every prompt starts with this word: the first word of a text has no space before it and
#: may cost differently, so it is always the same one, measured with the server's overhead.
LEAD = "the"
DIGITS = tuple("0123456789")
PIECES = POOL + DIGITS
#: A piece that costs more than this (or nothing) means the server does not count the prompt
#: the way a tokenizer does: the prompts then fall back to one token per word.
MAX_PIECE_TOKENS = 16
#: The checking prompt's length, in tokens: fits any context window.
CHECK_TOKENS = 48


@dataclass(frozen=True)
class Calibration:
    """What a prompt's pieces cost in the server's own count of prompt tokens."""

    #: The lead word with everything the server adds around a prompt (BOS, chat template).
    base_tokens: int = 1
    #: The tokens of each of :data:`PIECES` after a space, in that order (empty: one each).
    piece_tokens: tuple[int, ...] = ()
    measured: bool = False

    @property
    def tokens_per_word(self) -> float:
        costs = self.piece_tokens[:len(POOL)] or (1,)
        return sum(costs) / len(costs)


def pool_probe() -> str:
    """The lead word and every piece: one probe that says whether each piece is one token."""
    return " ".join((LEAD, *PIECES))


def piece_probes() -> list[str]:
    """The lead word with each piece on its own, in :data:`PIECES` order."""
    return [f"{LEAD} {piece}" for piece in PIECES]


def uniform(base_tokens: int) -> Calibration:
    """Every piece one token (what :func:`pool_probe` showed)."""
    return Calibration(base_tokens=base_tokens, piece_tokens=(1,) * len(PIECES), measured=True)


def fit_calibration(base_tokens: int, piece_counts: Sequence[int]) -> Calibration:
    """From the server's count of the lead word alone and of the lead word with each piece;
    counts that no tokenizer gives (a piece of no tokens, or too many) leave it uncalibrated."""
    costs = tuple(count - base_tokens for count in piece_counts)
    if len(costs) != len(PIECES) or not all(1 <= cost <= MAX_PIECE_TOKENS for cost in costs):
        return Calibration()
    return Calibration(base_tokens=base_tokens, piece_tokens=costs, measured=True)


class PromptMaker:
    """Prompts for planned requests under one calibration; block texts are cached."""

    def __init__(self, calibration: Calibration, seed: int = 0, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> None:
        if block_tokens < 1:
            raise ValueError(f"prefix block tokens must be positive, not {block_tokens}")
        self.calibration = calibration
        self._seed = seed
        self._block_tokens = block_tokens
        self._blocks: dict[int, str] = {}
        costs = calibration.piece_tokens or (1,) * len(PIECES)
        self._cost = dict(zip(PIECES, costs, strict=True))
        self._words = sorted(POOL, key=self._cost.__getitem__)
        self._max_cost = self._cost[self._words[-1]]

    def _fill(self, tokens: int, rng: random.Random) -> list[str]:
        """Words that cost exactly *tokens* (or as close below as the cheapest word allows)."""
        out: list[str] = []
        remaining = tokens
        while remaining > self._max_cost:
            # Any k of them cost at most k * max: more than the costliest word still fits after.
            drawn = rng.choices(self._words, k=max(1, remaining // self._max_cost - 1))
            remaining -= sum(self._cost[w] for w in drawn)
            out += drawn
        while remaining > 0:
            fits = [w for w in self._words if self._cost[w] <= remaining]
            if not fits:
                break
            word = rng.choice(fits)
            remaining -= self._cost[word]
            out.append(word)
        return out

    def _block(self, block_id: int) -> str:
        text = self._blocks.get(block_id)
        if text is None:
            text = " ".join(self._fill(self._block_tokens, random.Random(block_id * 1_000_003 + self._seed)))
            self._blocks[block_id] = text
        return text

    def prompt(self, index: int, input_tokens: int, prefix_blocks: tuple[int, ...] = ()) -> str:
        """*input_tokens* tokens in the server's count: the lead word, the shared blocks that fit,
        ``index`` in spaced digits, then words of its own."""
        budget = input_tokens - self.calibration.base_tokens
        digits = list(str(index))
        budget -= sum(self._cost[d] for d in digits)
        shared = [self._block(b) for b in prefix_blocks][: max(0, budget // self._block_tokens)]
        own = self._fill(budget - len(shared) * self._block_tokens, random.Random(index * 7919 + self._seed))
        return " ".join([LEAD, *shared, *digits, *own])
