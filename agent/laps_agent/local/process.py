"""`laps local` as a child process: start it, wait for the URL it prints, stop it as Ctrl-C does.
Used by `laps bench compare` (one stack per system) and by the tests."""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

URL_MARKER = "OpenAI-compatible API:"


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class LocalProcess:
    def __init__(self, args: list[str], workdir: Path | None, *, echo: bool = False) -> None:
        """`workdir` None: laps local's own temp dir."""
        where = ["--workdir", str(workdir)] if workdir is not None else []
        argv = [sys.executable, "-m", "laps_agent.cli", "local", "--port", "0", *where, *args]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self._lines: queue.Queue[str] = queue.Queue()
        self.echo = echo
        threading.Thread(target=self._pump, daemon=True).start()
        self.output: list[str] = []
        self.url = ""          # http://host:port/v1
        self.engines: set[int] = set()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line)
            if self.echo:
                print(line, end="", flush=True)

    def read_output(self) -> list[str]:
        """`output`, with every line printed since the last read appended."""
        while True:
            try:
                self.output.append(self._lines.get_nowait())
            except queue.Empty:
                return self.output

    @property
    def base(self) -> str:
        return self.url.removesuffix("/v1")

    def wait_ready(self, timeout: float) -> LocalProcess:
        """Block until the URL is printed; RuntimeError (with the output) if it exits or times out."""
        deadline = time.monotonic() + timeout
        while not self.url and time.monotonic() < deadline and self.proc.poll() is None:
            try:
                line = self._lines.get(timeout=1)
            except queue.Empty:
                continue
            self.output.append(line)
            if URL_MARKER in line:
                self.url = line.split(URL_MARKER)[1].split()[0]
        if not self.url:
            self.kill()
            raise RuntimeError("laps local did not start:\n" + "".join(self.output[-40:]))
        self.engines = descendants(self.proc.pid)
        return self

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGINT (Ctrl-C) and wait; kills what is left after `timeout`. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for pid in self.engines:
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def leftovers(self) -> set[int]:
        return {pid for pid in self.engines if alive(pid)}
