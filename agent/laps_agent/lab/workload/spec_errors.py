"""Validation errors of workload files in the file format's own words (`mix.yaml:
phases[1].arrival.rate: must be > 0`)."""
from __future__ import annotations

from pydantic import ValidationError


class _RuleError(ValueError):
    """A rule of a whole model about one of its fields: the error path gets that field appended."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


_TAGS = {"fixed", "uniform", "lognormal", "mixture", "lmsys", "jsonl", "poisson", "constant", "bursty"}


def _path(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _TAGS:  # pydantic's discriminated-union branch, not a key of the file
            continue
        else:
            out += f".{part}" if out else str(part)
    return out


def _message(err: dict) -> tuple[str, str]:
    """(extra path suffix, message) of one pydantic error, in the words of this file format."""
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind == "greater_than":
        return "", f"must be > {ctx.get('gt'):g}"
    if kind == "greater_than_equal":
        return "", f"must be >= {ctx.get('ge'):g}"
    if kind == "finite_number":
        return "", "must be a finite number"
    if kind == "extra_forbidden":
        return "", "unknown key"
    if kind == "missing":
        return "", "required"
    if kind == "union_tag_invalid":
        key = str(ctx.get("discriminator", "")).strip("'")
        return f".{key}", f"unknown {key} {ctx.get('tag')!r} (expected one of: {ctx.get('expected_tags')})"
    if kind == "union_tag_not_found":
        key = str(ctx.get("discriminator", "")).strip("'")
        return f".{key}", "required"
    if kind == "literal_error":
        return "", f"must be {ctx.get('expected')}"
    if kind in ("too_short", "string_too_short"):
        return "", "must not be empty"
    if kind == "value_error":
        return "", str(ctx.get("error", err["msg"]))
    return "", err["msg"]


def format_validation_error(exc: ValidationError, origin: str) -> str:
    lines = []
    for err in exc.errors():
        suffix, message = _message(err)
        where = _path(tuple(err["loc"])) + suffix
        rule = (err.get("ctx") or {}).get("error")
        if isinstance(rule, _RuleError):
            where = f"{where}{'' if rule.field.startswith('[') else '.'}{rule.field}" if where else rule.field
        lines.append(f"{origin}: {where.lstrip('.') or 'workload'}: {message}")
    return "\n".join(lines)


