"""Real SGLang servers for the tests: launched from .venv-sglang (scripts/setup_sglang.sh) with
the CPU flags measured in this project's notes, on loopback, each in its own process group so a
test never leaves one behind. Each server is ~5 GB RSS and ~30-60 s to start on a 2-core
machine: the fixtures in conftest.py share them per module or session."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

from laps_agent.local.engines import free_ports

REPO = Path(__file__).resolve().parents[2]
SGLANG_PY = REPO / ".venv-sglang" / "bin" / "python"
MODEL_DIR = REPO / ".cache" / "smollm2-hf"
SHIM = Path(__file__).resolve().parent / "cpu_shim"
# SGLang on CPU without its CPU kernels (see tests/sglang/cpu_shim for the one missing op).
# `--dtype float32`: with `auto`, SGLang serves a float32 checkpoint in float16, which CPUs
# without AVX512-FP16 run ~4x slower than float32 (an 896-token prefill: 7.4 s against 1.9 s on
# a 2-core AMD EPYC), enough to push the scheduling tests' timings past their bounds.
# `--sleep-on-idle`: an idle SGLang scheduler otherwise spins a core at 100% (two idle servers
# took both cores of a 2-core machine from the server under test and from the gateway); with
# it, an idle server waits on its input socket (~2% CPU). It sleeps only when fully idle (no
# queued, held or in-transfer request), so what the tests measure is unchanged; the package's
# tests went from ~380 s to ~285 s.
CPU_FLAGS = [
    "--device", "cpu", "--dtype", "float32", "--attention-backend", "torch_native", "--sampling-backend", "pytorch",
    "--disable-prefill-cuda-graph", "--disable-decode-cuda-graph", "--disable-overlap-schedule",
    "--mem-fraction-static", "0.1", "--max-total-tokens", "16384", "--skip-server-warmup",
    "--served-model-name", "smollm2", "--sleep-on-idle",
]


def setup_problem() -> str | None:
    """Why the SGLang tests cannot run here, or None."""
    if not SGLANG_PY.exists():
        return f"{SGLANG_PY} is missing: run scripts/setup_sglang.sh (make test does)"
    if not (MODEL_DIR / ".converted").exists():
        return f"{MODEL_DIR} is missing: run scripts/setup_sglang.sh (make test does)"
    return None



def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        # As a server binds it: connections of a previous server in TIME_WAIT do not count.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class SGLangServer:
    def __init__(self, role: str, log_dir: Path, env: dict[str, str] | None = None) -> None:
        # Both ports at once (free_ports holds each until all are chosen): the bootstrap port
        # is used by prefill servers only.
        self.port, bootstrap_port = free_ports(2)
        self.role = role
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"sglang-{role}-{self.port}.log"
        args = [str(SGLANG_PY), "-m", "sglang.launch_server", "--model-path", str(MODEL_DIR),
                "--host", "127.0.0.1", "--port", str(self.port), *CPU_FLAGS,
                "--disaggregation-mode", role, "--disaggregation-transfer-backend", "mooncake_tcp",
                "--enable-metrics"]
        if role == "prefill":
            # A free port of its own (the gateway reads it from /get_server_info, as
            # `disaggregation_bootstrap_port`), so servers of two test modules never collide.
            self.bootstrap_port = bootstrap_port
            args += ["--disaggregation-bootstrap-port", str(self.bootstrap_port)]
        else:
            # CPU-only: the default retraction backup pins CUDA host memory.
            args += ["--disaggregation-decode-retraction-backup", "cpu_tensor"]
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("LAPS_")}
        full_env.update({"SGLANG_HOST_IP": "127.0.0.1", "PYTHONPATH": str(SHIM),
                         "OMP_WAIT_POLICY": "PASSIVE", **(env or {})})
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=full_env,
                                     start_new_session=True, cwd=log_dir)

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(line[:300] for line in text[-lines:])

    def wait_ready(self, timeout: float = 240.0) -> SGLangServer:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"SGLang {self.role} server exited ({self.proc.returncode}):\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)  # poll interval, bounded by the deadline
        raise AssertionError(f"SGLang {self.role} server not ready in {timeout}s:\n{self.log_tail()}")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self) -> None:
        """Ask the server's process group to stop (SIGTERM: SGLang takes ~5 s to exit); `reap`
        waits for it."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)

    def reap(self) -> None:
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            pass
        try:  # SGLang's children may outlive the launcher on SIGTERM: the group goes too
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)
        self._log.close()

    def stop(self) -> None:
        self.terminate()
        self.reap()


def run_in_sglang_venv(code: str, timeout: float = 180.0) -> subprocess.CompletedProcess:
    """Run Python code with SGLang's interpreter (imports of sglang take ~10 s)."""
    env = {**os.environ, "PYTHONPATH": str(SHIM)}
    return subprocess.run([str(SGLANG_PY), "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)
