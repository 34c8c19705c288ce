"""`laps local --device cuda`: its engines share one GPU, so they share its memory. Each engine
sizes its KV pool from --mem-fraction of the free memory; three taking the default 0.85 each ran
the third out of CUDA memory on an H100 (found running scripts/gpu_local.sh there)."""
from __future__ import annotations

import pytest

from laps_agent.engine.cli import build_parser
from laps_agent.local.engines import shared_gpu_args


def _fraction_each_engine_takes(engine_args: list[str], device: str, engines: int) -> float:
    flags, _ = shared_gpu_args(device, engine_args, engines)
    return build_parser().parse_args(engine_args + flags).mem_fraction  # last flag wins, as in spawn


@pytest.mark.parametrize("device", ["cuda", "auto"])
def test_engines_on_one_gpu_split_the_memory_fraction(device):
    default = build_parser().parse_args([]).mem_fraction
    each = _fraction_each_engine_takes([], device, 3)
    assert each == pytest.approx(default / 3)
    assert _fraction_each_engine_takes(["--mem-fraction", "0.6"], device, 4) == pytest.approx(0.15)
    _, line = shared_gpu_args(device, [], 3)
    assert "3 engines share" in line and f"{default:g} / 3" in line


@pytest.mark.parametrize("engine_args,device,engines", [
    ([], "cpu", 3),                       # CPU pools are sized from the context, not free memory
    ([], "cuda", 1),                      # one engine has the device to itself
    (["--kv-pages", "4096"], "cuda", 3),  # the user sized the pools
])
def test_nothing_is_split_where_nothing_is_shared(engine_args, device, engines):
    assert shared_gpu_args(device, engine_args, engines) == ([], None)
