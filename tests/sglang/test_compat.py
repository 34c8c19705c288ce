"""Compatibility guard: every SGLang class, method, attribute and signature the plugin touches
(laps_agent/sglang_plugin/compat.py) exists as expected in the installed SGLang; and the guard
really names a mismatch when one appears."""
from __future__ import annotations

import json

import pytest

from tests.sglang.conftest import require_sglang
from tests.sglang.servers import run_in_sglang_venv

pytestmark = pytest.mark.sglang


def _problems(prelude: str = "") -> list[str]:
    require_sglang()
    code = (f"{prelude}\nimport json\nfrom laps_agent.sglang_plugin.compat import problems\n"
            "print('RESULT' + json.dumps(problems()))")
    done = run_in_sglang_venv(code)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT"):])


def test_installed_sglang_has_everything_the_plugin_touches():
    assert _problems() == []


def test_a_renamed_method_and_a_changed_signature_are_named():
    found = _problems(
        "from sglang.srt.managers.scheduler import Scheduler\n"
        "from sglang.srt.disaggregation.prefill import SchedulerDisaggregationPrefillMixin as M\n"
        "del Scheduler._get_new_batch_prefill_raw\n"
        "M.process_batch_result_disagg_prefill = lambda self, batch_, result: None\n")
    text = "\n".join(found)
    assert "Scheduler._get_new_batch_prefill_raw is missing" in text
    assert "process_batch_result_disagg_prefill takes ('self', 'batch_', 'result')" in text


def test_plugin_runs_only_on_a_prefill_server_without_pipeline_parallelism():
    require_sglang()
    code = """
import logging, types
logging.basicConfig(level=logging.INFO)
from sglang.srt.disaggregation.utils import DisaggregationMode as M
from laps_agent.sglang_plugin.hooks import _state
from laps_agent.sglang_plugin.settings import load_settings
settings = load_settings({"LAPS_SCHEDULER": "1"})
def sched(mode, pp):
    return types.SimpleNamespace(disaggregation_mode=mode, tp_size=1, tree_cache=None,
                                 server_args=types.SimpleNamespace(pp_size=pp, served_model_name="m"))
print("RESULT", _state(sched(M.DECODE, 1), settings) is None, _state(sched(M.NULL, 1), settings) is None,
      _state(sched(M.PREFILL, 2), settings) is None, _state(sched(M.PREFILL, 1), settings) is not None)
"""
    done = run_in_sglang_venv(code)
    result = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert result == ["RESULT True True True True"], done.stderr[-3000:]
    assert "pipeline parallelism (pp_size=2) is not supported" in done.stderr


def test_a_misconfigured_plugin_stops_sglang_at_start(sglang_logs):
    """A typo'd knob is an error at start, as a bad `laps engine` flag is. Before, the name was
    ignored (and a bad value only logged): a Ready pod ran vanilla SGLang, FIFO."""
    from tests.sglang.conftest import start_prefill
    from tests.support.waiting import poll

    server = start_prefill(sglang_logs, {"LAPS_SCHEDULER": "1", "LAPS_WAIT_WINDOW": "20"})
    try:
        poll(lambda: server.proc.poll() is not None, timeout=180, message="SGLang to refuse to start")
        assert server.proc.returncode != 0
        assert ("LAPS plugin: bad configuration: LAPS_WAIT_WINDOW is not a LAPS plugin setting; "
                "did you mean LAPS_WAIT_WINDOW_MS?") in server.log_text()
    finally:
        server.stop()
