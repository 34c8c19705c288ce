"""Request shapes the gateway checks before routing (and publishes in its OpenAPI).

Only what routing and a clear 4xx need is checked; every other field passes through to the
engines untouched (extra="allow"), so new sampling options need no gateway change."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

_PASS_THROUGH = ConfigDict(extra="allow")


class _Sampling(BaseModel):
    model_config = _PASS_THROUGH
    model: str | None = Field(None, description="must name the served model when given")
    stream: bool | None = Field(False, description="null: not streamed (OpenAI's default)")
    max_tokens: int | None = Field(None, ge=0)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None


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
        return self


class ErrorDetail(BaseModel):
    message: str
    type: str
    code: int


class ErrorBody(BaseModel):
    error: ErrorDetail
