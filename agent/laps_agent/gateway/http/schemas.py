"""Request shapes the gateway checks before routing (and publishes in its OpenAPI).

Only what routing and a clear 4xx need is checked; every other field passes through to the
engines untouched (extra="allow"), so new sampling options need no gateway change."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_PASS_THROUGH = ConfigDict(extra="allow")


def one_sample(n: Any) -> Any:
    """Several samples per prompt (n > 1) do not work through PD: SGLang 0.5.23's prefill server
    answers, its decode server never does (the client waited until its own timeout), and the
    builtin engine refuses them. A 4xx at once beats a hang until the deadline."""
    if isinstance(n, int) and not isinstance(n, bool) and n > 1:
        raise ValueError(f"n={n} is not supported with prefill/decode disaggregation (one "
                         f"sample per request): send the request {n} times instead")
    return n


class _Sampling(BaseModel):
    model_config = _PASS_THROUGH
    model: str | None = Field(None, description="must name the served model when given")
    stream: bool | None = Field(False, description="null: not streamed (OpenAI's default)")
    max_tokens: int | None = Field(None, ge=0)
    # Python's json reads NaN and Infinity literals: "Input should be a finite number", not a
    # NaN said to be below 0, or an infinity that passes here and fails in the engine.
    temperature: float | None = Field(None, ge=0, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    n: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None

    @field_validator("n")
    @classmethod
    def _one_sample(cls, n: int | None) -> int | None:
        return one_sample(n)


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]


class ContentPart(BaseModel):
    model_config = _PASS_THROUGH
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = _PASS_THROUGH
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=0)


class GenerateRequest(BaseModel):
    """SGLang's native /generate body."""
    model_config = _PASS_THROUGH
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | None = None
    stream: bool | None = False

    @model_validator(mode="after")
    def _needs_input(self) -> GenerateRequest:
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("give exactly one of `text` or `input_ids`")
        one_sample((self.sampling_params or {}).get("n"))
        return self


class ErrorDetail(BaseModel):
    message: str
    type: str
    code: int


class ErrorBody(BaseModel):
    error: ErrorDetail
