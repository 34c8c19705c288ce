"""The workload spec: a YAML file of phases, each with an arrival process and length distributions.

Top level: `name`, `seed`, `api` (completions | chat: the endpoint the load generator calls),
`threshold` (prompts of <= threshold tokens are "short" in reports) and `phases`, run back to
back, each with a `name`, exactly one of `duration_s` | `requests`, `arrival`, `prompt_tokens`
and `output_tokens` (an example: docs/measuring.md, Workloads).

Distributions (token counts, integers >= 1): `fixed` (value), `uniform` (min, max; inclusive),
`lognormal` (median, sigma, min=1, max: truncated by redrawing, see lengths.py), `mixture`
(components, each a distribution with a positive `weight`), `lmsys` (the built-in LMSYS-like
prompt mix, lengths.LMSYS_LIKE), `jsonl` (prompts of a JSONL file; a phase's prompt_tokens only,
see jsonl.py). Arrival processes (`rate` in requests/s, > 0): `poisson`, `constant` (evenly
spaced), `bursty` (Poisson whose rate is multiplied by burst_factor during the first burst_s
seconds of every period_s; see arrivals.py).

Every error names the file and the field: `mix.yaml: phases[1].arrival.rate: must be > 0`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from laps_agent.lab.workload.spec_errors import _RuleError, format_validation_error
from laps_agent.policy.classes import DEFAULT_LENGTH_THRESHOLD

BUILTIN_DIR = Path(__file__).parent / "builtin"
DEFAULT_THRESHOLD = DEFAULT_LENGTH_THRESHOLD


class WorkloadError(ValueError):
    """A workload that does not exist or is not valid; the message names the file and field."""


class _Strict(BaseModel):
    # `.inf` is valid YAML and > 0, but no rate, duration or length: an infinite rate was an
    # OverflowError deep in planning.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class _Dist(_Strict):
    # Only mixture components carry a weight; checked by Mixture and Phase.
    weight: float | None = Field(default=None, gt=0)


class Fixed(_Dist):
    distribution: Literal["fixed"]
    value: int = Field(ge=1)


class Uniform(_Dist):
    distribution: Literal["uniform"]
    min: int = Field(ge=1)
    max: int = Field(ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> Uniform:
        if self.min > self.max:
            raise _RuleError("min", f"must be <= max ({self.max}), got {self.min}")
        return self


class LogNormal(_Dist):
    distribution: Literal["lognormal"]
    median: float = Field(gt=0)
    sigma: float = Field(ge=0)
    min: int = Field(default=1, ge=1)
    max: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> LogNormal:
        if self.max is not None and self.min > self.max:
            raise _RuleError("min", f"must be <= max ({self.max}), got {self.min}")
        return self


class Lmsys(_Dist):
    distribution: Literal["lmsys"]


class Jsonl(_Dist):
    distribution: Literal["jsonl"]
    path: str = Field(min_length=1)                 # relative to the workload file's directory
    order: Literal["sequential", "sample"] = "sequential"


class Mixture(_Dist):
    distribution: Literal["mixture"]
    components: list[LengthDist] = Field(min_length=1)

    @model_validator(mode="after")
    def _weighted(self) -> Mixture:
        for i, c in enumerate(self.components):
            if c.weight is None:
                raise _RuleError(f"components[{i}].weight", "required in a mixture (a positive number)")
            if isinstance(c, Jsonl):
                raise _RuleError(f"components[{i}].distribution", "jsonl cannot be a mixture component")
        return self


LengthDist = Annotated[Union[Fixed, Uniform, LogNormal, Mixture, Lmsys, Jsonl],
                       Field(discriminator="distribution")]
Mixture.model_rebuild()


class Poisson(_Strict):
    process: Literal["poisson"]
    rate: float = Field(gt=0)

    @property
    def mean_rate(self) -> float:
        return self.rate


class Constant(_Strict):
    process: Literal["constant"]
    rate: float = Field(gt=0)

    @property
    def mean_rate(self) -> float:
        return self.rate


class Bursty(_Strict):
    process: Literal["bursty"]
    rate: float = Field(gt=0)                       # outside bursts
    burst_factor: float = Field(gt=0)               # rate multiplier during a burst
    burst_s: float = Field(gt=0)                    # burst at the start of every period
    period_s: float = Field(gt=0)

    @model_validator(mode="after")
    def _fits(self) -> Bursty:
        if self.burst_s > self.period_s:
            raise _RuleError("burst_s", f"must be <= period_s ({self.period_s:g}), got {self.burst_s:g}")
        return self

    @property
    def mean_rate(self) -> float:
        return self.rate * (1.0 + (self.burst_factor - 1.0) * self.burst_s / self.period_s)


Arrival = Annotated[Union[Poisson, Constant, Bursty], Field(discriminator="process")]


class Conversation(_Strict):
    """A phase of multi-turn conversations (workload/conversations.py): the phase's arrivals
    start conversations, its prompt_tokens is the first turn's prompt, its output_tokens every
    answer; each later turn re-sends the whole conversation plus `new_tokens` of user message."""
    turns: LengthDist                               # turns per conversation (>= 1)
    new_tokens: LengthDist                          # the user message a later turn adds
    think_s: float = Field(default=20.0, gt=0)      # mean pause between reading an answer and the next turn
    min_think_s: float = Field(default=2.0, ge=0)
    # The user reads the answer at this pace before thinking (a recorded conversation's clock).
    answer_tokens_per_s: float = Field(default=30.0, gt=0)
    max_prompt_tokens: int = Field(default=32000, ge=2)   # a conversation ends before passing it

    @model_validator(mode="after")
    def _think(self) -> Conversation:
        if self.min_think_s > self.think_s:
            raise _RuleError("min_think_s", f"must be <= think_s ({self.think_s:g}), got {self.min_think_s:g}")
        return self


class Phase(_Strict):
    name: str = Field(min_length=1)
    duration_s: float | None = Field(default=None, gt=0)
    requests: int | None = Field(default=None, ge=1)
    arrival: Arrival
    prompt_tokens: LengthDist
    output_tokens: LengthDist
    conversation: Conversation | None = None        # multi-turn: arrivals start conversations

    @model_validator(mode="after")
    def _one_length(self) -> Phase:
        if (self.duration_s is None) == (self.requests is None):
            raise ValueError("give exactly one of duration_s or requests")
        for field in ("prompt_tokens", "output_tokens"):
            if getattr(self, field).weight is not None:
                raise _RuleError(f"{field}.weight", "only mixture components have a weight")
        if isinstance(self.output_tokens, Jsonl):
            raise _RuleError("output_tokens.distribution", "jsonl is only for prompt_tokens (a line's "
                             "output_tokens overrides the phase's output_tokens)")
        return self


class WorkloadSpec(_Strict):
    name: str = Field(min_length=1)
    description: str = ""
    seed: int = Field(default=0, ge=0)
    api: Literal["completions", "chat"] = "completions"
    threshold: int = Field(default=DEFAULT_THRESHOLD, ge=1)
    phases: list[Phase] = Field(min_length=1)
    # Where relative jsonl paths are resolved (the YAML file's directory); not part of the spec.
    _base_dir: Path | None = PrivateAttr(default=None)
    _origin: str = PrivateAttr(default="workload")

    @model_validator(mode="after")
    def _unique_names(self) -> WorkloadSpec:
        names = [p.name for p in self.phases]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise _RuleError(f"phases[{i}].name", f"duplicate phase name {name!r}")
        return self

    @property
    def base_dir(self) -> Path:
        return self._base_dir or Path.cwd()

    @property
    def origin(self) -> str:
        return self._origin

    def to_dict(self) -> dict:
        return self.model_dump(mode="json", exclude_none=True)


# ---------------------------------------------------------------- loading

def parse_workload(data: Any, origin: str = "workload", base_dir: Path | None = None) -> WorkloadSpec:
    if not isinstance(data, dict):
        raise WorkloadError(f"{origin}: a workload is a YAML mapping (name, phases, ...)")
    try:
        spec = WorkloadSpec.model_validate(data)
    except ValidationError as exc:
        raise WorkloadError(format_validation_error(exc, origin)) from None
    spec._base_dir = base_dir
    spec._origin = origin
    return spec


def available_workloads() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml"))


def read_named_yaml(path_or_name: str | Path, builtin_dir: Path, kind: tuple[str, str],
                    error: type[Exception]) -> tuple[object, Path]:
    """A YAML file by path, or a built-in one of `builtin_dir` by name: (its data, its path).
    A name that is neither, a file that cannot be read and text that is not YAML raise `error`
    naming the `kind` of file, singular and plural (("workload", "workloads"))."""
    one, many = kind
    key = str(path_or_name)
    path = Path(key)
    if not (path.suffix in (".yaml", ".yml") or path.exists()):
        path = builtin_dir / f"{key}.yaml"
        if not path.exists():
            builtins = sorted(p.stem for p in builtin_dir.glob("*.yaml"))
            raise error(f"unknown {one} {key!r}: not a file, and the built-in {many} "
                        f"are: {', '.join(builtins)}")
    try:
        text = path.read_text()
    except OSError as exc:
        raise error(f"cannot read {one} {path}: {exc.strerror or exc}") from None
    try:
        return yaml.safe_load(text), path
    except yaml.YAMLError as exc:
        raise error(f"{path.name}: not valid YAML: {exc}") from None


def load_workload(path_or_name: str | Path) -> WorkloadSpec:
    """A workload YAML file by path, or a built-in workload by name (`available_workloads()`)."""
    data, path = read_named_yaml(path_or_name, BUILTIN_DIR, ("workload", "workloads"), WorkloadError)
    return parse_workload(data, path.name, path.resolve().parent)
