"""The request plan is the same in another process: nothing in it depends on the process (hash
seeds, dict order, the time it was made)."""
from __future__ import annotations

import json
import subprocess
import sys

from laps_agent.lab.workload import parse_workload, plan_requests
from tests.unit.workload.test_plan import phase


def test_the_plan_is_the_same_in_another_process():
    doc = {"name": "t", "seed": 3, "phases": [phase("a"), phase("b", duration_s=4)]}
    code = ("import json,sys; from laps_agent.lab.workload import parse_workload, plan_requests; "
            "p = plan_requests(parse_workload(json.loads(sys.argv[1]))); "
            "print(json.dumps([p.at.tolist(), p.prompt_tokens.tolist(), p.output_tokens.tolist()]))")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(doc)], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    here = plan_requests(parse_workload(doc))
    assert json.loads(out) == [here.at.tolist(), here.prompt_tokens.tolist(), here.output_tokens.tolist()]
