"""What a benchmark run or a simulation produced: one record per request, a timeline of the
target's groups, and the run's meta data.

Records are held column-wise (numpy arrays) because a simulator produces a million of them;
`RequestTable` still reads like a list of `RequestRecord`s (len, index, iteration). Missing
values: NaN in float columns, -1 in optional-int columns, None in string columns; a
`RequestRecord` shows all of them as None.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Iterator

import numpy as np

from laps_agent.policy.classes import CLASSES, DEFAULT_LENGTH_THRESHOLD


@dataclass
class RequestRecord:
    index: int
    phase: str
    cls: str                          # "short" | "long": planned prompt_tokens vs the threshold
    prompt_tokens: int                # planned
    output_tokens: int                # planned (max_tokens sent)
    sent_s: float                     # when it was sent, seconds since the run start
    status: int                       # HTTP status; 0: no response (connection error, timeout before headers)
    error: str | None = None          # None: succeeded
    ttft_s: float | None = None       # first non-empty content chunk
    e2e_s: float | None = None        # until the response ended (or failed)
    tokens: int = 0                   # content chunks received
    itl_mean_s: float | None = None   # over this request's gaps between content chunks (>= 2 chunks)
    itl_p90_s: float | None = None
    itl_max_s: float | None = None
    server_prompt_tokens: int | None = None   # usage.prompt_tokens when the server sends it
    sent_prompt_tokens: int | None = None     # token count of the prompt actually sent (our tokenizer)
    turn: int | None = None                   # turn index in its conversation (1 = first); None: single
    cached_tokens: int | None = None          # prompt tokens the server found cached, when it says

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None


# column name -> kind: "i" int, "oi" optional int (-1), "f" float (NaN), "s" str, "os" optional str
COLUMNS: dict[str, str] = {
    "index": "i", "phase": "s", "cls": "s", "prompt_tokens": "i", "output_tokens": "i", "sent_s": "f",
    "status": "i", "error": "os", "ttft_s": "f", "e2e_s": "f", "tokens": "i", "itl_mean_s": "f",
    "itl_p90_s": "f", "itl_max_s": "f", "server_prompt_tokens": "oi", "sent_prompt_tokens": "oi",
    "turn": "oi", "cached_tokens": "oi",
}
assert list(COLUMNS) == [f.name for f in fields(RequestRecord)]


def _array(kind: str, values: Iterable[Any]) -> np.ndarray:
    values = list(values) if not isinstance(values, np.ndarray) else values
    if kind == "i":
        return np.asarray(values, dtype=np.int64)
    if kind == "oi":
        if isinstance(values, np.ndarray):
            return values.astype(np.int64)
        return np.array([-1 if v is None else v for v in values], dtype=np.int64)
    if kind == "f":
        return np.asarray(values, dtype=np.float64)  # None becomes NaN
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _value(kind: str, v: Any) -> Any:
    if kind == "i":
        return int(v)
    if kind == "oi":
        return None if v < 0 else int(v)
    if kind == "f":
        return None if v != v else float(v)
    return v


class RequestTable:
    """Column-wise records. Build from records (`from_records`) or arrays (`from_columns`)."""

    def __init__(self, columns: dict[str, np.ndarray]):
        missing = set(COLUMNS) - set(columns)
        if missing:
            raise ValueError(f"missing record columns: {', '.join(sorted(missing))}")
        sizes = {len(columns[name]) for name in COLUMNS}
        if len(sizes) > 1:
            raise ValueError(f"record columns differ in length: {sorted(sizes)}")
        self.columns = {name: _array(kind, columns[name]) for name, kind in COLUMNS.items()}

    @classmethod
    def from_records(cls, records: Iterable[RequestRecord]) -> RequestTable:
        records = list(records)
        return cls({name: _array(kind, [getattr(r, name) for r in records]) for name, kind in COLUMNS.items()})

    @classmethod
    def from_columns(cls, /, **columns: Any) -> RequestTable:  # "/": a column is named cls
        """Arrays by column name; `error`, `server_prompt_tokens`, `sent_prompt_tokens`, the ITL
        columns, `turn`, `cached_tokens` and `tokens` may be left out (no error / unknown / zero)."""
        n = len(columns["index"])
        defaults = {"error": np.full(n, None, dtype=object), "server_prompt_tokens": np.full(n, -1),
                    "sent_prompt_tokens": np.full(n, -1), "tokens": np.zeros(n, dtype=np.int64),
                    "itl_mean_s": np.full(n, np.nan), "itl_p90_s": np.full(n, np.nan),
                    "itl_max_s": np.full(n, np.nan), "turn": np.full(n, -1),
                    "cached_tokens": np.full(n, -1)}
        return cls({**defaults, **columns})

    def __len__(self) -> int:
        return len(self.columns["index"])

    def __getitem__(self, i: int) -> RequestRecord:
        return RequestRecord(**{name: _value(kind, self.columns[name][i]) for name, kind in COLUMNS.items()})

    def __iter__(self) -> Iterator[RequestRecord]:
        return (self[i] for i in range(len(self)))

    def __getattr__(self, name: str) -> np.ndarray:
        try:
            return self.__dict__["columns"][name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def ok(self) -> np.ndarray:
        """Boolean mask of requests that succeeded."""
        return (self.columns["status"] == 200) & (self.columns["error"] == None)  # noqa: E711 (elementwise)


@dataclass
class TimelineSample:
    t: float                                                     # seconds since the run start
    pods: dict[str, int] = field(default_factory=dict)           # group -> pods
    pending_tokens: dict[str, int] = field(default_factory=dict)
    pending_requests: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_status(cls, t: float, status: dict) -> TimelineSample:
        """From a `/laps_status` document (docs/http-api.md)."""
        groups = status.get("groups") or {}
        sample = cls(t)
        for name in CLASSES:
            group = groups.get(name) or {}
            sample.pods[name] = len(group.get("pods") or [])
            sample.pending_tokens[name] = int(group.get("pending_tokens") or 0)
            sample.pending_requests[name] = int(group.get("pending_requests") or 0)
        return sample


@dataclass
class RunResult:
    """meta: label, workload ({"name", "spec", ...}), seed, target (URL, or "sim"), threshold,
    started_at, duration_s, tool ("laps bench run" | "laps sim"), phases ([{name, start_s,
    end_s, ...}]), slo, and anything else the tool knows."""
    meta: dict
    records: RequestTable | list[RequestRecord]
    timeline: list[TimelineSample] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.records, RequestTable):
            self.records = RequestTable.from_records(self.records)

    @property
    def label(self) -> str:
        return str(self.meta.get("label") or "run")

    @property
    def threshold(self) -> int:
        return int(self.meta.get("threshold") or DEFAULT_LENGTH_THRESHOLD)
