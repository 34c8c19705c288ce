"""The tokenizer in a fresh interpreter (a process: tests/unit starts none): the gateway imports
laps_agent.modelio.tokenizer and must not pull in torch."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_gguf_tokenizer_known_ids_without_importing_torch(smollm2_path):
    # A fresh interpreter: the gateway imports this module and must not pull in torch.
    code = (
        "import sys, json\n"
        "from laps_agent.modelio.tokenizer import load_tokenizer\n"
        f"tok = load_tokenizer({str(smollm2_path)!r})\n"
        "print(json.dumps({'ids': tok.encode('Hello, world 123', add_special_tokens=True),\n"
        "                  'torch': 'torch' in sys.modules,\n"
        "                  'eos': sorted(tok.eos_token_ids), 'bos': tok.bos_token_id, 'vocab': tok.vocab_size}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=REPO, env={"PYTHONPATH": str(REPO / "agent"), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    # 'Hello' ',' 'Ġworld' 'Ġ' '1' '2' '3': digits split one by one, no BOS (SmolLM2's tokenizer).
    assert got == {"ids": [19556, 28, 905, 216, 33, 34, 35], "torch": False,
                   "eos": [2], "bos": 1, "vocab": 49152}
