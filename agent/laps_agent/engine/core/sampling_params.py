"""Per-request sampling parameters and stop detection (torch-free: the HTTP side and the emulated
engine use them; the next-token choice itself is in sampling.py)."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

DEFAULT_MAX_NEW_TOKENS = 128
# A character is at most 4 UTF-8 bytes, so at most 4 tokens: output pending for longer holds
# bytes that never form one (StopState._commit_whole_characters).
PENDING_TOKENS_MAX = 4
# Prompt tokens the output is decoded after (StopState.context), as SGLang and vLLM do.
CONTEXT_TOKENS = 5


class SamplingError(ValueError):
    """Bad sampling parameters; the server answers 400 with this message."""


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1                          # -1 or 0: no top-k cut
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    seed: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise SamplingError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise SamplingError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise SamplingError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise SamplingError(f"top_k must be -1 (off) or a positive integer, got {self.top_k!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise SamplingError("stop strings must be non-empty strings")
        if len(self.stop) > 16:
            raise SamplingError("at most 16 stop strings are allowed")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @classmethod
    def from_dict(cls, raw: dict | None) -> "SamplingParams":
        """Build from SGLang-style `sampling_params` (unknown keys are ignored like SGLang does,
        wrong types are errors)."""
        raw = dict(raw or {})
        try:
            max_new = raw.get("max_new_tokens", raw.get("max_tokens"))
            stop = raw.get("stop") or ()
            if isinstance(stop, str):
                stop = (stop,)
            if not isinstance(stop, (list, tuple)):  # tuple() of a dict would stop on its keys
                raise SamplingError(f"stop must be a string or a list of strings, got {stop!r}")
            stop_ids = raw.get("stop_token_ids") or ()
            if not isinstance(stop_ids, (list, tuple)):
                raise SamplingError(f"stop_token_ids must be a list of integer token ids, got {stop_ids!r}")
            ignore_eos = raw.get("ignore_eos")
            if ignore_eos is not None and not isinstance(ignore_eos, bool):  # bool("false") is True
                raise SamplingError(f"ignore_eos must be a boolean, got {ignore_eos!r}")
            seed = raw.get("seed", raw.get("sampling_seed"))
            return cls(
                max_new_tokens=DEFAULT_MAX_NEW_TOKENS if max_new is None else _int(max_new, "max_new_tokens"),
                temperature=_float(raw.get("temperature"), 1.0, "temperature"),
                top_p=_float(raw.get("top_p"), 1.0, "top_p"),
                top_k=_int(-1 if raw.get("top_k") in (None, 0) else raw["top_k"], "top_k"),
                stop=tuple(stop),
                stop_token_ids=frozenset(_int(t, "stop_token_ids") for t in stop_ids),
                ignore_eos=bool(ignore_eos),
                seed=None if seed is None else _int(seed, "seed"),
            )
        except (TypeError, ValueError, OverflowError) as exc:  # float() of a 400-digit integer
            if isinstance(exc, SamplingError):
                raise
            raise SamplingError(f"invalid sampling_params: {exc}") from None

    def to_dict(self) -> dict:
        return {"max_new_tokens": self.max_new_tokens, "temperature": self.temperature,
                "top_p": self.top_p, "top_k": self.top_k, "stop": list(self.stop),
                "stop_token_ids": sorted(self.stop_token_ids), "ignore_eos": self.ignore_eos,
                "seed": self.seed}


def is_whole_number(value: object) -> bool:
    """An integer, or a float with an integer value (JSON writes 3.0), never a bool. An infinite
    float (JSON's 1e999) is none: int() of it raises OverflowError, not ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or (math.isfinite(value) and int(value) == value)


def _float(value: object, default: float, name: str) -> float:
    """A number (a numeric string still reads as one), never a bool: float(True) made `true` a
    temperature of 1."""
    if value is None:
        return default
    if isinstance(value, bool):
        raise SamplingError(f"{name} must be a number, got {value!r}")
    return float(value)  # type: ignore[arg-type]  # anything else: TypeError/ValueError, a 400


def _int(value: object, name: str) -> int:
    if not is_whole_number(value):
        raise SamplingError(f"{name} must be an integer, got {value!r}")
    return int(value)


@dataclass
class StopState:
    """Tracks one request's output text and decides when it stops.

    `decode` turns the output ids into text; text that could still turn into a stop string (or an
    unfinished UTF-8 sequence) is held back so a streamed client never sees a stop string.

    `context`: the prompt's ids, of which the last CONTEXT_TOKENS are decoded before the output
    (and are no part of it). Decoded alone, a first token loses what its context gives it: a
    SentencePiece decoder (Llama 2, Mistral) strips the space that begins a text, so "▁Paris"
    after "▁is" read "Paris" where SGLang and vLLM answer " Paris", and the prompt and its
    completion ran together ("isParis"). Byte-level tokenizers decode the same either way."""

    params: SamplingParams
    eos_token_ids: frozenset[int]
    decode: Callable[[list[int]], str]
    context: Sequence[int] = ()
    output_ids: list[int] = field(default_factory=list)
    text_ids: list[int] = field(default_factory=list)   # the context's ids, then the output's text
    emitted: int = 0                                     # characters of text already released
    # Incremental detokenization: decode only text_ids[prefix:] and diff it against
    # text_ids[prefix:read], so each step costs O(window) and tokenizers that drop a leading
    # space at a slice start (SentencePiece) still give the same text as a full decode.
    prefix: int = 0
    read: int = 0
    text: str = ""
    finish_reason: str | None = None
    matched_stop: str | int | None = None

    def __post_init__(self) -> None:
        tail = list(self.context[-CONTEXT_TOKENS:])
        # A context ending inside a character (its other bytes to come in the output) decodes
        # to a U+FFFD that the output would replace: the text's offsets would be off. Rare
        # (a prompt cut mid-character): decoded without context then, as before.
        if tail and not self.decode(tail).endswith("\ufffd"):
            self.text_ids, self.prefix, self.read = tail, 0, len(tail)

    def add(self, token: int) -> str:
        """Record one generated token; returns the newly releasable text."""
        self.output_ids.append(token)
        if token in self.params.stop_token_ids:
            return self.end("stop", token)
        if token in self.eos_token_ids and not self.params.ignore_eos:
            return self.end("stop", token)
        self.text_ids.append(token)
        self._detokenize()
        stop = self._cut_at_stop()
        if stop is not None:
            return self._finish("stop", stop)
        if len(self.output_ids) >= self.params.max_new_tokens:
            return self.end("length", None)
        releasable = len(self.text) - self._holdback()
        delta = self.text[self.emitted:releasable] if releasable > self.emitted else ""
        self.emitted += len(delta)
        return delta

    def end(self, reason: str, matched: str | int | None) -> str:
        """Finish now (EOS, a stop token, max_new_tokens, or the engine's context is full) and
        return the rest of the text. Bytes still waiting for the rest of their character are
        released as they decode (U+FFFD), as SGLang does and as a decode of the output ids
        reads: dropped, the text lacked what the counted tokens said. A stop string in them
        still stops the text there."""
        if self.read < len(self.text_ids):
            before = self.decode(self.text_ids[self.prefix:self.read])
            self.text += self.decode(self.text_ids[self.prefix:])[len(before):]
            self.read = len(self.text_ids)
        stop = self._cut_at_stop()
        return self._finish("stop", stop) if stop is not None else self._finish(reason, matched)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def _cut_at_stop(self) -> str | None:
        """The earliest stop string in the text, which is cut there; None if there is none."""
        if not self.params.stop:
            return None
        start = max(0, self.emitted - max(map(len, self.params.stop)))
        hits = [(self.text.find(s, start), s) for s in self.params.stop]
        hits = [(i, s) for i, s in hits if i >= 0]
        if not hits:
            return None
        index, stop = min(hits)
        self.text = self.text[:index]
        return stop

    def _finish(self, reason: str, matched: str | int | None) -> str:
        self.finish_reason, self.matched_stop = reason, matched
        delta = self.text[self.emitted:]
        self.emitted = len(self.text)
        return delta

    def _detokenize(self) -> None:
        before = self.decode(self.text_ids[self.prefix:self.read])
        after = self.decode(self.text_ids[self.prefix:])
        # An unfinished UTF-8 sequence decodes to U+FFFD: wait for the token that completes it.
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self._commit(before, after, len(self.text_ids))
        elif len(self.text_ids) - self.read > PENDING_TOKENS_MAX:
            self._commit_whole_characters(before, after)

    def _commit(self, before: str, upto_text: str, upto: int) -> None:
        """text_ids[:upto] (decoded from `prefix` as `upto_text`) become text."""
        self.text += upto_text[len(before):]
        self.prefix, self.read = self.read, upto

    def _commit_whole_characters(self, before: str, after: str) -> None:
        """Pending longer than any character takes: bytes that never form one (a degenerate
        model's stray lead bytes). Waiting on, every step decoded the whole run again (O(n^2)
        on the engine thread) and nothing of it reached a stream. Release the pending tokens up
        to the last cut that splits no character (both sides decoded apart read as the whole:
        a character's bytes on both sides would decode to U+FFFD on each); the last
        character's bytes, within the last tokens, go on waiting."""
        n = len(self.text_ids)
        for cut in range(n - 1, max(self.read, n - PENDING_TOKENS_MAX), -1):
            head = self.decode(self.text_ids[self.prefix:cut])
            if head + self.decode(self.text_ids[cut:]) == after:
                self._commit(before, head, cut)
                return

    def _holdback(self) -> int:
        hold = 0
        for stop in self.params.stop:
            for n in range(min(len(stop) - 1, len(self.text)), 0, -1):
                if self.text.endswith(stop[:n]):
                    hold = max(hold, n)
                    break
        return hold
