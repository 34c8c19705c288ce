"""The matrix file: which systems, over which cells, judged against which SLOs.

```yaml
name: family
systems: [vanilla-pd, laps, laps-pooled, sglang-cache-aware]   # the first is the baseline
slo: {short: 0.5, long: 3}            # TTFT SLO per class, seconds
profiles: [gpu-h200-qwen2.5-32b]      # engine profiles (names or files)
shapes: [4P+4D, 8P+2D, 16P+4D]        # prefill + decode engines
loads: [0.3, 0.5, 0.7, 0.9]           # fractions of vanilla-pd's simulated capacity on the cell's mix
max_requests: 2000                    # per cell: the workload is shortened to about this many
seed: 1                               # optional: every workload's seed
workloads: [mixed-shift]              # optional: named (built-in) workloads or workload files
duration_s: 120                       # a generated workload's length (its phases share it)
threshold: 256                        # a generated workload's short/long threshold
arrivals:                             # name -> an arrival process, or a list: one per phase
  steady: {process: poisson, rate: 1}
  ramp: [{process: poisson, rate: 0.5}, {process: poisson, rate: 1}, {process: poisson, rate: 1.5}]
lengths:                              # name -> prompt_tokens, output_tokens (and conversation), or a list: one per phase
  lmsys: {prompt_tokens: {distribution: lmsys}, output_tokens: {distribution: fixed, value: 16}}
```

Every `arrivals` entry is combined with every `lengths` entry into a workload `arrival/lengths`:
as many phases as the longer of the two lists, phase i taking entry i (modulo its list's length)
of each, all of `duration_s / phases` seconds. Absolute rates do not matter (`loads` sets the mean
rate), only their ratios within a list. The cells are every workload x profile x shape x load, in
that order; `cell_setup` turns one into what a driver runs (pure: `laps sim --matrix` and
`laps bench compare --matrix` run it).

Errors name the file and the field: `m.yaml: shapes[1]: expected <P>P+<D>D (e.g. 8P+2D), got '8+2'`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from laps_agent.lab.workload.spec import (
    Arrival,
    Bursty,
    Conversation,
    LengthDist,
    Phase,
    WorkloadError,
    WorkloadSpec,
    load_workload,
    parse_workload,
    read_named_yaml,
)
from laps_agent.lab.workload.spec_errors import _RuleError, format_validation_error

BUILTIN_DIR = Path(__file__).parent / "builtin"
_SHAPE = re.compile(r"^\s*(\d+)\s*P\s*\+\s*(\d+)\s*D\s*$", re.IGNORECASE)


class MatrixError(ValueError):
    """A matrix that does not exist or is not valid; the message names the file and field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Lengths(_Strict):
    prompt_tokens: LengthDist
    output_tokens: LengthDist
    conversation: Conversation | None = None


@dataclass(frozen=True)
class Shape:
    prefill: int
    decode: int

    @property
    def name(self) -> str:
        return f"{self.prefill}P+{self.decode}D"


def parse_shape(text: str) -> Shape:
    m = _SHAPE.match(str(text))
    if not m or int(m[1]) < 1 or int(m[2]) < 1:
        raise ValueError(f"expected <P>P+<D>D with P, D >= 1 (e.g. 8P+2D), got {text!r}")
    return Shape(int(m[1]), int(m[2]))


class MatrixSpec(_Strict):
    name: str = Field(default="matrix", min_length=1)
    description: str = ""
    systems: list[str] = Field(default=["vanilla-pd", "laps"], min_length=1)
    slo: dict[str, float] = Field(default={"short": 0.5, "long": 3.0})
    profiles: list[str] = Field(default=["gpu-h200-qwen2.5-32b"], min_length=1)
    shapes: list[str] = Field(default=["8P+2D"], min_length=1)
    loads: list[float] = Field(default=[0.7], min_length=1)
    max_requests: int = Field(default=2000, ge=1)
    seed: int | None = Field(default=None, ge=0)
    workloads: list[str] = Field(default=[])
    duration_s: float = Field(default=120.0, gt=0)
    threshold: int = Field(default=256, ge=1)
    arrivals: dict[str, Union[Arrival, list[Arrival]]] = Field(default={})
    lengths: dict[str, Union[Lengths, list[Lengths]]] = Field(default={})

    @field_validator("systems")
    @classmethod
    def _systems(cls, value: list[str]) -> list[str]:
        for i, name in enumerate(value):
            if name in value[:i]:
                raise _RuleError(f"[{i}]", f"{name!r} is listed twice")
        return value

    @field_validator("slo")
    @classmethod
    def _slo(cls, value: dict[str, float]) -> dict[str, float]:
        for key, seconds in value.items():
            if key not in ("short", "long", "all"):
                raise _RuleError(key, "unknown class (expected short, long or all)")
            if not seconds > 0:
                raise _RuleError(key, f"must be > 0 seconds, got {seconds:g}")
        return value

    @field_validator("shapes")
    @classmethod
    def _shapes(cls, value: list[str]) -> list[str]:
        for i, text in enumerate(value):
            try:
                parse_shape(text)
            except ValueError as exc:
                raise _RuleError(f"[{i}]", str(exc)) from None
        return value

    @field_validator("loads")
    @classmethod
    def _loads(cls, value: list[float]) -> list[float]:
        for i, load in enumerate(value):
            if not load > 0:
                raise _RuleError(f"[{i}]", f"must be > 0, got {load:g}")
        return value

    @model_validator(mode="after")
    def _cells(self) -> MatrixSpec:
        if bool(self.arrivals) != bool(self.lengths):
            missing = "lengths" if self.arrivals else "arrivals"
            raise _RuleError(missing, "required with " + ("arrivals" if self.arrivals else "lengths")
                             + " (each arrival process is combined with each length mix)")
        if not self.workloads and not self.arrivals:
            raise _RuleError("workloads", "give workloads, or arrivals and lengths: the matrix has no cell")
        for block in ("arrivals", "lengths"):
            for key, entry in getattr(self, block).items():
                if isinstance(entry, list) and not entry:
                    raise _RuleError(f"{block}.{key}", "must not be empty")
        return self


@dataclass(frozen=True)
class Cell:
    """One cell of a matrix: what every system runs on once."""
    workload: str      # a `workloads` entry, or `arrival/lengths`
    profile: str
    shape: Shape
    load: float

    @property
    def id(self) -> str:
        return f"{self.workload} {self.shape.name} @{self.load:g}"


@dataclass(frozen=True)
class CellSetup:
    spec: WorkloadSpec   # the workload, at its own rates (the driver scales them to `load`)
    prefill: int
    decode: int
    load: float
    profile: str


@dataclass(frozen=True)
class Matrix:
    spec: MatrixSpec
    origin: str
    base_dir: Path

    @property
    def systems(self) -> list[str]:
        return list(self.spec.systems)

    def workload_names(self) -> list[str]:
        return [*self.spec.workloads, *(f"{a}/{n}" for a in self.spec.arrivals for n in self.spec.lengths)]

    def label(self, cell: Cell) -> str:
        """The cell's name in reports: its id, and its profile where the matrix has several."""
        return cell.id + (f" {Path(cell.profile).stem}" if len(self.spec.profiles) > 1 else "")

    def cells(self) -> list[Cell]:
        s = self.spec
        return [Cell(w, p, parse_shape(shape), float(load)) for w in self.workload_names() for p in s.profiles
                for shape in s.shapes for load in s.loads]


def generated_workload(spec: MatrixSpec, arrival: str, lengths: str) -> WorkloadSpec:
    """The workload `arrival/lengths` of the matrix's arrivals x lengths blocks."""
    arrivals, mixes = spec.arrivals[arrival], spec.lengths[lengths]
    arrivals = arrivals if isinstance(arrivals, list) else [arrivals]
    mixes = mixes if isinstance(mixes, list) else [mixes]
    n = max(len(arrivals), len(mixes))
    phases = []
    for i in range(n):
        mix = mixes[i % len(mixes)]
        phase: dict[str, Any] = {"name": f"p{i + 1}", "duration_s": spec.duration_s / n,
                                 "arrival": arrivals[i % len(arrivals)].model_dump(mode="json"),
                                 **mix.model_dump(mode="json", exclude_none=True)}
        phases.append(phase)
    data = {"name": f"{arrival}/{lengths}", "seed": spec.seed or 0, "threshold": spec.threshold,
            "api": "chat" if any(m.conversation is not None for m in mixes) else "completions", "phases": phases}
    return parse_workload(data, f"{arrival}/{lengths}")


def cell_setup(matrix: Matrix, cell: Cell) -> CellSetup:
    """What one cell runs: its workload (with the matrix's seed), cluster shape, load, profile."""
    s = matrix.spec
    if cell.workload in s.workloads:
        name = cell.workload
        path = Path(name)
        if path.suffix in (".yaml", ".yml") and not path.is_absolute():
            candidate = matrix.base_dir / path
            name = str(candidate) if candidate.exists() else name
        spec = load_workload(name)
        if s.seed is not None:
            spec = spec.model_copy(update={"seed": s.seed})
    else:
        arrival, _, lengths = cell.workload.partition("/")
        spec = generated_workload(s, arrival, lengths)
    return CellSetup(spec, cell.shape.prefill, cell.shape.decode, cell.load, cell.profile)


def shortened(spec: WorkloadSpec, factor: float) -> WorkloadSpec:
    """`spec` with every phase `factor` (< 1) as long (duration_s, or requests), so a cell's
    request budget covers all its phases rather than the first ones alone; but a bursty phase
    of a duration keeps at least one whole period (`whole_periods`)."""
    if factor >= 1:
        return spec
    phases = [p.model_copy(update={"duration_s": p.duration_s * max(factor, _one_period(p))}
                           if p.duration_s is not None
                           else {"requests": max(1, round(p.requests * factor))}) for p in spec.phases]
    out = spec.model_copy(update={"phases": phases})
    out._base_dir, out._origin = spec._base_dir, spec._origin
    return out


def whole_periods(spec: WorkloadSpec, factor: float) -> bool:
    """Whether `shortened(spec, factor)` kept some bursty phase longer than `factor` (then the
    cell takes more requests than its budget: a cell shorter than one burst period measures
    its first burst, an overload, rather than bursts)."""
    return factor < 1 and any(p.duration_s is not None and _one_period(p) > factor for p in spec.phases)


def _one_period(phase: Phase) -> float:
    """The share of `phase` that is one period of its bursty arrivals (0: not bursty)."""
    if not isinstance(phase.arrival, Bursty):
        return 0.0
    return min(1.0, phase.arrival.period_s / phase.duration_s)


def parse_matrix(data: Any, origin: str = "matrix", base_dir: Path | None = None) -> Matrix:
    if not isinstance(data, dict):
        raise MatrixError(f"{origin}: a matrix is a YAML mapping (systems, shapes, loads, workloads, ...)")
    try:
        spec = MatrixSpec.model_validate(data)
    except ValidationError as exc:
        raise MatrixError(format_validation_error(exc, origin)) from None
    matrix = Matrix(spec, origin, base_dir or Path.cwd())
    for i, name in enumerate(spec.workloads):  # found now, not after the cells before it ran
        try:
            cell_setup(matrix, Cell(name, spec.profiles[0], parse_shape(spec.shapes[0]), spec.loads[0]))
        except WorkloadError as exc:
            raise MatrixError(f"{origin}: workloads[{i}]: {exc}") from None
    for a in spec.arrivals:
        for n in spec.lengths:
            try:
                generated_workload(spec, a, n)
            except WorkloadError as exc:
                raise MatrixError(f"{origin}: arrivals.{a} x lengths.{n}: {exc}") from None
    return matrix


def available_matrices() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml"))


def load_matrix(path_or_name: str | Path, seed: int | None = None) -> Matrix:
    """A matrix YAML file by path, or a built-in matrix by name (`available_matrices()`); `seed`:
    instead of the file's (a driver's --seed)."""
    data, path = read_named_yaml(path_or_name, BUILTIN_DIR, ("matrix", "matrices"), MatrixError)
    matrix = parse_matrix(data, path.name, path.resolve().parent)
    if seed is not None:
        matrix = replace(matrix, spec=matrix.spec.model_copy(update={"seed": seed}))
    return matrix
