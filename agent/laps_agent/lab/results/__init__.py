"""Results of `laps bench run|compare` and `laps sim`: per-request records and the groups
timeline (records), result files (files: results.json, results.md, plots), statistics
(summary) and markdown tables (report). numpy only at import; matplotlib when plots are drawn."""
from __future__ import annotations

from laps_agent.lab.results.files import load_result, save, to_json
from laps_agent.lab.results.records import CLASSES, RequestRecord, RequestTable, RunResult, TimelineSample
from laps_agent.lab.results.report import compare_markdown, markdown, moves_by_phase, phases_markdown
from laps_agent.lab.results.summary import ClassStats, Summary, summarize

__all__ = ["CLASSES", "ClassStats", "RequestRecord", "RequestTable", "RunResult", "Summary",
           "TimelineSample", "compare_markdown", "load_result", "markdown", "moves_by_phase", "phases_markdown", "save",
           "summarize", "to_json"]
