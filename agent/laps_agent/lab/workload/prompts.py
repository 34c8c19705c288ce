"""Prompt text of an exact token count, cheap enough to build per request at hundreds per second.

The filler is English words that are each ONE token with their leading space (" the", " data")
in the target tokenizer. With byte-level BPE tokenizers that split words at spaces (GPT-2,
SmolLM2, Llama 3, Qwen2) a text of k such words is exactly k tokens; the builder checks this
once, when it is created, by encoding samples ("additive" mode) and then builds every prompt
without encoding: a string slice of a pre-drawn random word stream, so a 4000-token prompt
costs microseconds. A tokenizer where the check fails gets "encode" mode: build, encode, add or
remove words until the count is exact (a few encodes per prompt). Without a tokenizer
("approximate"), one word counts as one token and `BuiltPrompt.tokens` is None.

No two prompts share a prefix (which a radix/prefix cache would reuse): each starts with a few
words that spell the request index in base-V digits (V = vocabulary size, mixed with the seed,
a bijection), followed by the stream from an index-dependent offset.

Chat: `messages(n)` is one user message whose chat-templated, encoded prompt has exactly n
tokens; the template's own tokens (role markers, a default system prompt: 30 tokens for
SmolLM2) are measured once. Below that overhead + 1 word the prompt is that minimum, and
`BuiltPrompt.tokens` says so.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

COMMON_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which "
    "but have an they you were their one all we can her has there been if more when will would "
    "who so no data model time value system people work number part way world state water year "
    "day group information about after also back because before being between both could down "
    "each even first good great help here high home house into just know large last life like "
    "line little long make many most much must name need never new next night now old only open "
    "order other over own place point power problem program public read real right same school "
    "second should show small some sound still such take than then these thing think three "
    "through under until very want well what where while white word world write young table "
    "field text light river paper music city story science energy market garden simple course"
).split()
_STREAM_WORDS = 8192          # pre-drawn filler; longer prompts wrap around it
_MIN_VOCAB = 16
_UNIQUE_PREFIXES = 10 ** 9    # distinct index prefixes before any can repeat


@dataclass(frozen=True)
class BuiltPrompt:
    value: str | list[dict]       # completion prompt text, or chat messages
    tokens: int | None            # its token count in the tokenizer (None: no tokenizer)


def _single_token_words(tokenizer: Any) -> list[str]:
    words = [f" {w}" for w in dict.fromkeys(COMMON_WORDS) if len(tokenizer.encode(f" {w}")) == 1]
    if len(words) >= _MIN_VOCAB:
        return words
    # A small vocabulary (test models): use its own single-token alphabetic pieces.
    for i in range(tokenizer.vocab_size):
        piece = tokenizer.decode([i])
        if (len(piece) >= 2 and piece[0] == " " and piece[1:].isascii() and piece[1:].isalpha()
                and piece not in words and tokenizer.encode(piece) == [i]):
            words.append(piece)
    return words


class PromptBuilder:
    def __init__(self, tokenizer: Any | None = None, seed: int = 0):
        self.tokenizer = tokenizer
        self.seed = seed
        words = _single_token_words(tokenizer) if tokenizer is not None else [f" {w}" for w in COMMON_WORDS]
        if len(words) < 2:
            words = [f" {w}" for w in COMMON_WORDS]
        self.words = words
        rng = random.Random(seed)
        stream = rng.choices(words, k=_STREAM_WORDS)
        single = "".join(stream)
        self._text2 = single + single
        self._offsets = [0]
        for w in stream + stream:
            self._offsets.append(self._offsets[-1] + len(w))
        self._single = single
        self._radix = len(words)
        self._digits = max(1, math.ceil(math.log(_UNIQUE_PREFIXES) / math.log(self._radix)))
        self._space = self._radix ** self._digits
        self._mix = random.Random(seed ^ 0x5EED).randrange(self._space)
        self.chars_per_token = len(single) / _STREAM_WORDS
        if tokenizer is None:
            self.mode = "approximate"
        else:
            self.mode = "additive" if self._additive() else "encode"
        self._chat_overhead: int | None = None
        self._chat_additive: bool | None = None

    # ------------------------------------------------------------ text

    def _filler(self, n: int, index: int) -> str:
        """n filler words: a unique index prefix, then the stream from an index-dependent offset."""
        if n <= 0:
            return ""
        key = (index * 1_000_003 + self._mix) % self._space  # bijective: 1_000_003 is prime
        digits = []
        for _ in range(min(n, self._digits)):
            key, d = divmod(key, self._radix)
            digits.append(self.words[d])
        rest = n - len(digits)
        start = (index * 2_654_435_761 + self.seed) % _STREAM_WORDS
        whole, part = divmod(rest, _STREAM_WORDS)
        return "".join(digits) + self._single * whole + self._text2[self._offsets[start]:self._offsets[start + part]]

    def _count(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def _additive(self) -> bool:
        for n, index in ((1, 0), (7, 1), (300, 2), (2000, 3)):
            if self._count(self._filler(n, index)) != n:
                return False
        return True

    def _fit(self, n: int, index: int, count) -> tuple[int, int]:
        """(words, tokens): the word count whose text `count`s closest to n tokens, found by
        moving the word count by the remaining difference (non-additive tokenizers)."""
        words, best = n, None
        for _ in range(8):
            tokens = count(words)
            if best is None or abs(tokens - n) < abs(best[1] - n):
                best = (words, tokens)
            if tokens == n or words + (n - tokens) < 0:
                break
            words = max(0, words + (n - tokens))
        return best

    def text(self, n_tokens: int, index: int) -> str:
        return self.build_text(n_tokens, index).value

    def build_text(self, n_tokens: int, index: int) -> BuiltPrompt:
        if self.mode == "approximate":
            return BuiltPrompt(self._filler(n_tokens, index), None)
        if self.mode == "additive":
            return BuiltPrompt(self._filler(n_tokens, index), max(0, n_tokens))
        words, tokens = self._fit(n_tokens, index, lambda w: self._count(self._filler(w, index)))
        return BuiltPrompt(self._filler(words, index), tokens)

    # ------------------------------------------------------------ chat

    def _templated(self, words: int, index: int) -> int:
        return self._count(self.tokenizer.apply_chat_template(self._message(words, index)))

    def _message(self, words: int, index: int) -> list[dict]:
        return [{"role": "user", "content": self._filler(words, index)}]

    def chat_overhead(self) -> int | None:
        """Tokens the chat template adds around one user message (None without a tokenizer)."""
        if self.tokenizer is None:
            return None
        if self._chat_overhead is None:
            overheads = {self._templated(k, 7) - k for k in (1, 40, 333)}
            self._chat_overhead = min(overheads)
            self._chat_additive = self.mode == "additive" and len(overheads) == 1
        return self._chat_overhead

    def messages(self, n_tokens: int, index: int) -> list[dict]:
        return self.build_messages(n_tokens, index).value

    def build_messages(self, n_tokens: int, index: int) -> BuiltPrompt:
        overhead = self.chat_overhead()
        if overhead is None:
            return BuiltPrompt(self._message(max(1, n_tokens), index), None)
        if self._chat_additive:
            words = max(1, n_tokens - overhead)
            return BuiltPrompt(self._message(words, index), overhead + words)
        words, tokens = self._fit(max(1, n_tokens - overhead), index, lambda w: self._templated(w, index) - overhead)
        words = max(1, words)
        return BuiltPrompt(self._message(words, index), self._templated(words, index))

    def build(self, n_tokens: int, index: int, api: str) -> BuiltPrompt:
        return self.build_messages(n_tokens, index) if api == "chat" else self.build_text(n_tokens, index)
