"""Compatibility guard: every SGLang class, method, attribute and signature the plugin touches
(laps_agent/sglang_plugin/compat.py) exists as expected in the installed SGLang; and the guard
really names a mismatch when one appears."""
from __future__ import annotations

import json
from typing import NamedTuple

import pytest

from tests.sglang.conftest import require_sglang
from tests.sglang.servers import run_in_sglang_venv

pytestmark = pytest.mark.sglang


# One interpreter for the three checks (importing SGLang takes ~10 s): the guard on the installed
# SGLang, the plugin's refusal of decode and pipeline-parallel servers, then the guard again
# after this script renames a method and changes a signature (last: it breaks SGLang).
CHECKS = """
import json, logging, types
logging.basicConfig(level=logging.INFO)
from laps_agent.sglang_plugin.compat import problems
print("RESULT installed " + json.dumps(problems()))

from sglang.srt.disaggregation.utils import DisaggregationMode as Mode
from laps_agent.sglang_plugin.hooks import _state
from laps_agent.sglang_plugin.settings import load_settings
settings = load_settings({"LAPS_SCHEDULER": "1"})
def sched(mode, pp):
    return types.SimpleNamespace(disaggregation_mode=mode, tp_size=1, tree_cache=None,
                                 server_args=types.SimpleNamespace(pp_size=pp, served_model_name="m"))
print("RESULT runs " + json.dumps({"decode": _state(sched(Mode.DECODE, 1), settings) is not None,
                                   "not disaggregated": _state(sched(Mode.NULL, 1), settings) is not None,
                                   "prefill pp=2": _state(sched(Mode.PREFILL, 2), settings) is not None,
                                   "prefill": _state(sched(Mode.PREFILL, 1), settings) is not None}))

from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.disaggregation.prefill import SchedulerDisaggregationPrefillMixin as M
del Scheduler._get_new_batch_prefill_raw
M.process_batch_result_disagg_prefill = lambda self, batch_, result: None
print("RESULT broken " + json.dumps(problems()))
"""


class Checked(NamedTuple):
    results: dict     # name -> what CHECKS printed for it
    log: str          # its stderr (the plugin's log lines)


@pytest.fixture(scope="module")
def checked() -> Checked:
    require_sglang()
    done = run_in_sglang_venv(CHECKS)
    results = dict(line.split(" ", 2)[1:] for line in done.stdout.splitlines() if line.startswith("RESULT "))
    assert done.returncode == 0 and len(results) == 3, done.stderr[-3000:]
    return Checked({name: json.loads(value) for name, value in results.items()}, done.stderr)


def test_installed_sglang_has_everything_the_plugin_touches(checked):
    assert checked.results["installed"] == []


def test_a_renamed_method_and_a_changed_signature_are_named(checked):
    text = "\n".join(checked.results["broken"])
    assert "Scheduler._get_new_batch_prefill_raw is missing" in text
    assert "process_batch_result_disagg_prefill takes ('self', 'batch_', 'result')" in text


def test_plugin_runs_only_on_a_prefill_server_without_pipeline_parallelism(checked):
    assert checked.results["runs"] == {"decode": False, "not disaggregated": False, "prefill pp=2": False, "prefill": True}
    assert "pipeline parallelism (pp_size=2) is not supported" in checked.log


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
