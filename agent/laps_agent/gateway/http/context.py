"""A prompt that can never fit the engines' context, refused by the gateway before admission.

The engines refuse a prompt that leaves no room for one new token (400
`context_length_exceeded`; prompt_rules.py holds its message, and stock SGLang's). Admission
(admission.py) runs before any engine sees the request, and its 429 is resent by clients, for a
request that can never succeed (docs/design/overload.md). So the gateway gives the engines'
refusal itself, word for word, ahead of admission and of routing, whenever it is certain of it:

- the prompt's count is exact (estimate.py `PromptCount.exact`: token ids, or the model's
  tokenizer; the engine may count a text a special token more, never fewer), and
- the engines have said how long a prompt they take (`max_prompt_tokens` in their `/get_load`;
  stock SGLang's context, gateway/proxy/sglang_limit.py; both kept in
  gateway/proxy/engine_load.py): the largest any prefill pod takes, or any decode pod takes,
  whichever is smaller, so that no pair of pods would have served it.

Otherwise (a heuristic estimate, which may be off by 10% either way, engines that report no
limit, such as SGLang that truncates prompts or could not be asked, or `--no-engine-load-poll`)
the engine decides: a heuristic is never trusted to refuse a prompt an engine might take."""
from __future__ import annotations

from collections.abc import Callable, Iterable

from laps_agent.gateway.discovery.membership import Membership
from laps_agent.gateway.estimate import PromptCount
from laps_agent.gateway.proxy.failures import GatewayError
from laps_agent.modelio.prompt_rules import CONTEXT_LENGTH_EXCEEDED, PromptLimit


def engines_limit(membership: Membership,
                  reported: Callable[[Iterable[str]], PromptLimit | None]) -> PromptLimit | None:
    """The longest prompt some prefill pod and some decode pod of `membership` both take, as far
    as they reported it (`reported(names)`: the largest of those pods' limits); None: unknown, or
    any length."""
    prefill = reported(e.name for pods in membership.groups.values() for e in pods)
    decode = reported(e.name for e in membership.decode)
    known = [limit for limit in (prefill, decode) if limit is not None]
    return min(known, key=lambda limit: limit.tokens) if known else None


def refuse_over_context(count: PromptCount, limit: PromptLimit | None) -> None:
    """GatewayError 400 `context_length_exceeded` when a prompt of `count` is certain not to fit
    engines that take at most `limit.tokens` tokens, in those engines' words."""
    if limit is not None and count.exact and count.tokens > limit.tokens:
        raise GatewayError(400, CONTEXT_LENGTH_EXCEEDED, limit.refusal(count.tokens),
                           kind=CONTEXT_LENGTH_EXCEEDED)
