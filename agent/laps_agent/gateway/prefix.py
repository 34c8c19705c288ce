"""Prompt prefixes as chains of block hashes, and the gateway's record of what it sent where.

A prompt is cut into blocks of the units the token estimate works on, with no tokenizer: chat,
one block per message (role + text: a later turn re-sends the earlier messages verbatim, so the
earlier request's chain is a prefix of the later one's); text, BLOCKS_PER_TIER blocks of
BLOCK_CHARS characters, then tiers of BLOCKS_PER_TIER blocks each twice as long as the last;
token ids, the same tiers in BLOCK_IDS ids. Only whole blocks: a partial last block changes when
the text grows, so it could never match. The tiers keep a block under 1/BLOCKS_PER_TIER of the
text before it (what a pod holds is known to ~6% of its length) and the block count logarithmic
in the length (docs/design/gateway-overhead.md); block ends are fixed positions, so two prompts
sharing a prefix share its blocks whatever their lengths. Each block's hash chains the previous
one's (Python's own hash, salted per process: only this process compares them), so equal hashes
at block i mean equal prefixes up to it; a block end's tokens are the request's estimate scaled
by the characters up to there.

`PrefixRecord` is the gateway's memory of the chains it sent to each prefill pod: a bounded LRU
of block hashes per pod (laps_agent.policy.prefix_blocks: what is held of a chain stays a prefix
of it, so `held` is a binary search), standing in for the pod's prefix cache, which the gateway
cannot see.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Any, Sequence

from laps_agent.policy.prefix_blocks import BlockLRU

BLOCK_CHARS = 256          # ~60 tokens of English: fine enough that a 40-token turn is not lost
BLOCK_IDS = 64
BLOCKS_PER_TIER = 16
MAX_BLOCKS = 8192          # chat messages; text and ids: up to 8192 first-tier blocks' length
                           # (~2 MB of text): beyond, a longer match would change nothing
_MESSAGE_OVERHEAD_CHARS = 20   # a chat message's role markers, in characters (~5 tokens)
DEFAULT_RECORD_BLOCKS_PER_POD = 65536


@dataclass(frozen=True, slots=True)
class PrefixChain:
    hashes: tuple[int, ...]   # chained block hashes, first block first
    ends: tuple[int, ...]     # estimated prompt tokens up to the end of each block
    answers: frozenset[int] = frozenset()   # chat: the blocks that are assistant messages

    def __len__(self) -> int:
        return len(self.hashes)


def _chain(parts: Sequence[Any], sizes: Sequence[int], tokens: int, total: int,
           answers: frozenset[int] = frozenset()) -> PrefixChain | None:
    if not parts or total <= 0:
        return None
    hashes, ends = [], []
    h, done = 0, 0
    for part, size in zip(parts, sizes):
        h = hash((h, part))
        done += size
        hashes.append(h)
        ends.append(min(tokens, tokens * done // total))
    return PrefixChain(tuple(hashes), tuple(ends), answers)


def _tier_ends(unit: int) -> tuple[int, ...]:
    """Where the blocks of a text (`unit` BLOCK_CHARS) or of token ids (BLOCK_IDS) end."""
    ends, size, end = [], unit, 0
    while True:
        for _ in range(BLOCKS_PER_TIER):
            end += size
            if end > MAX_BLOCKS * unit:
                return tuple(ends)
            ends.append(end)
        size *= 2


_TEXT_ENDS, _IDS_ENDS = _tier_ends(BLOCK_CHARS), _tier_ends(BLOCK_IDS)
_TEXT_BLOCKS = tuple(slice(a, b) for a, b in zip((0, *_TEXT_ENDS), _TEXT_ENDS))
_IDS_BLOCKS = tuple(slice(a, b) for a, b in zip((0, *_IDS_ENDS), _IDS_ENDS))


def _tiered_chain(prompt: str | list, tokens: int, ends: tuple[int, ...],
                  blocks: tuple[slice, ...]) -> PrefixChain | None:
    # _chain's loop, specialised: the block ends are fixed and never past the prompt's end.
    total = len(prompt)
    n = bisect_right(ends, total)
    if n == 0:
        return None
    hashes: list[int] = []
    append, h = hashes.append, 0
    if isinstance(prompt, str):
        for block in blocks[:n]:
            h = hash((h, prompt[block]))
            append(h)
    else:
        for block in blocks[:n]:
            h = hash((h, tuple(prompt[block])))
            append(h)
    return PrefixChain(tuple(hashes), tuple([tokens * end // total for end in ends[:n]]))


def _content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: the text parts, as the estimate counts
        return "".join(p.get("text", "") for p in content
                       if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def prefix_chain(body: dict, kind: str, tokens: int) -> PrefixChain | None:
    """The block chain of a request body (`kind` as the estimate's), or None where it has no
    usable prompt (batched prompts: their KV is several sequences, no one prefix)."""
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return None
        parts, sizes, answers = [], [], []
        for i, m in enumerate(messages[:MAX_BLOCKS]):
            if not isinstance(m, dict):
                return None
            text = _content(m.get("content"))
            role = str(m.get("role", ""))
            parts.append((role, text))
            sizes.append(len(text) + _MESSAGE_OVERHEAD_CHARS)
            if role == "assistant":
                answers.append(i)
        total = sum(sizes) + _MESSAGE_OVERHEAD_CHARS  # + the generation prompt
        return _chain(parts, sizes, tokens, total, frozenset(answers))
    prompt = body.get("prompt") if kind == "completion" else (
        body.get("input_ids") if body.get("input_ids") is not None else body.get("text"))
    if isinstance(prompt, str):
        return _tiered_chain(prompt, tokens, _TEXT_ENDS, _TEXT_BLOCKS)
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt[:BLOCK_IDS]):
        return _tiered_chain(prompt, tokens, _IDS_ENDS, _IDS_BLOCKS)
    return None


class PrefixRecord:
    """Per prefill pod, the block hashes this gateway sent there lately (bounded LRU).

    `answers_warmed` (the engines' --prefix-warm, engine/prefix_warm.py): a pod that served a
    chat turn is sent its answer to compute, which the gateway never sees (streamed answers pass
    through unparsed). So where what a pod holds of a chat ends right before an assistant
    message, that message is expected held too: it is the answer the pod was warmed with."""

    def __init__(self, blocks_per_pod: int = DEFAULT_RECORD_BLOCKS_PER_POD, *, answers_warmed: bool = False) -> None:
        if blocks_per_pod < 1:
            raise ValueError(f"blocks_per_pod must be >= 1, got {blocks_per_pod}")
        self.blocks_per_pod = blocks_per_pod
        self.answers_warmed = answers_warmed
        self._pods: dict[str, BlockLRU] = {}
        self.evictions = 0

    def held(self, pod: str, chain: PrefixChain | None) -> int:
        """Estimated tokens of `chain`'s longest prefix that `pod` is expected to hold."""
        blocks = self.held_blocks(pod, chain)
        return chain.ends[blocks - 1] if blocks else 0

    def held_blocks(self, pod: str, chain: PrefixChain | None) -> int:
        seen = self._pods.get(pod)
        if seen is None or not chain:
            return 0
        blocks = seen.held(chain.hashes)
        if blocks and self.answers_warmed and blocks in chain.answers:
            blocks += 1  # the answer the pod was warmed with
        return blocks

    def record(self, pod: str, chain: PrefixChain | None) -> None:
        """`pod` was sent this chain: it will hold it (most recently used, first block last)."""
        if not chain:
            return
        seen = self._pods.get(pod)
        if seen is None:
            seen = self._pods[pod] = BlockLRU(self.blocks_per_pod)
        self.evictions += seen.touch(chain.hashes)   # a chain longer than the record: its head

    def pods(self) -> set[str]:
        """The pods this record holds something for."""
        return set(self._pods)

    def forget(self, pod: str) -> None:
        """The pod restarted or left: it holds nothing any more."""
        self._pods.pop(pod, None)

    def blocks(self, pod: str) -> int:
        return len(self._pods.get(pod, ()))
