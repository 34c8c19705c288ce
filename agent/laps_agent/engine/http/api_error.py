"""The engine's error answer (4xx/5xx + OpenAI-shaped body), in a module of its own so that the
request parsers split out of api_models.py can raise it without importing that module."""
from __future__ import annotations


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", *,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type = status, message, type_
        self.retry_after = retry_after  # seconds, sent as Retry-After

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "code": self.status}}
