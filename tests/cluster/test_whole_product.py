"""The whole product on a real control plane, CR to answer (whole_product.py says each step):
every pod the chart and the operator create runs its container's own command line, bound to the
IP kwok gave it, in a network namespace of the test's own where that range is local."""
from __future__ import annotations

import shutil
import subprocess
import sys

from tests.cluster.story import REPO


def test_a_lapscluster_answers_an_openai_client_through_its_gateway_pod(tmp_path):
    assert shutil.which("unshare") and shutil.which("ip"), "needs util-linux's unshare and iproute2's ip"
    result = subprocess.run(["unshare", "--user", "--map-root-user", "--net", sys.executable, "-m",
                             "tests.cluster.whole_product", str(tmp_path)],
                            cwd=REPO, capture_output=True, text=True, timeout=400)
    print(result.stdout)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr[-8000:]}"
    assert "answer: " in result.stdout
