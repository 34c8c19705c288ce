"""What the engines and the gateway must agree on about a prompt, in one place: how a chat role
reaches the chat template, and the refusal of a prompt longer than the context.

The gateway counts a prompt's tokens the way the engine will (gateway/estimate.py) and, when
that count is exact and the engines have told it their limit, refuses an over-long prompt itself
(gateway/context.py): the client must get the engine's own answer, word for word, whichever of
the two gives it. Stock SGLang (the sglang backend) words its refusal its own way
(`sglang_over_context_message`); `PromptLimit` says whose words a limit comes with."""
from __future__ import annotations

from typing import NamedTuple

# The error type of the refusal (OpenAI's code for it, and the engines' error type).
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


def over_context_message(tokens: int, limit: int) -> str:
    """The refusal of a prompt of `tokens` tokens by engines that take at most `limit`: a prompt
    as long as the context leaves no room for one new token, so it is refused up front, as
    SGLang refuses it."""
    return (f"the prompt has {tokens} tokens; this engine takes at most {limit}: "
            f"prompt + completion must fit in its context of {limit + 1} tokens")


def sglang_over_context_message(tokens: int, context_len: int) -> str:
    """Stock SGLang's refusal of a prompt of `tokens` tokens with a context of `context_len`,
    word for word: sglang/srt/managers/tokenizer_manager.py, TokenizerManager._validate_one_request
    (SGLang 0.5.23), which refuses `tokens >= context_len` before anything else is checked."""
    return (f"The input ({tokens} tokens) is longer than the model's context length "
            f"({context_len} tokens).")


class PromptLimit(NamedTuple):
    """The longest prompt engines take, and whose words refuse a longer one."""
    tokens: int
    sglang: bool = False   # stock SGLang's words, else this project's engines'

    def refusal(self, tokens: int) -> str:
        """The message refusing a prompt of `tokens` tokens (more than `self.tokens`)."""
        if self.sglang:   # SGLang's context: it refuses a prompt as long as it, so one more
            return sglang_over_context_message(tokens, self.tokens + 1)
        return over_context_message(tokens, self.tokens)


def template_role(role: str) -> str:
    """The role a chat template renders for an OpenAI message role. OpenAI's `developer` role is
    what `system` was; chat templates know only `system` (an unknown role is rendered as such,
    and the template adds its default system prompt)."""
    return "system" if role == "developer" else role
