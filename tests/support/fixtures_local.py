"""`laps local` as a child process, the way a user runs it: `LocalStack.start(args)` waits for the
printed URL; `stop()` sends Ctrl-C (SIGINT) and checks that no engine process is left.

Fixture `laps_local`: start(*args, timeout=...) -> LocalStack, every stack stopped at teardown."""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.waiting import poll


def descendants(pid: int) -> set[int]:
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


class LocalStack:
    def __init__(self, args: list[str], workdir: Path) -> None:
        argv = [sys.executable, "-m", "laps_agent.cli", "local", "--port", "0",
                "--workdir", str(workdir), *args]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [self._lines.put(line) for line in self.proc.stdout],
                         daemon=True).start()
        self.output: list[str] = []
        self.url = ""          # http://host:port/v1
        self.engines: set[int] = set()

    @property
    def base(self) -> str:
        return self.url.removesuffix("/v1")

    def wait_ready(self, timeout: float) -> LocalStack:
        deadline = time.monotonic() + timeout
        while not self.url and time.monotonic() < deadline and self.proc.poll() is None:
            try:
                line = self._lines.get(timeout=1)
            except queue.Empty:
                continue
            self.output.append(line)
            if "OpenAI-compatible API:" in line:
                self.url = line.split("API:")[1].split()[0]
        if not self.url:
            raise AssertionError("laps local printed no URL:\n" + "".join(self.output))
        self.engines = descendants(self.proc.pid)
        return self

    def stop(self) -> None:
        """Ctrl-C, as a user stops it; then every engine must be gone."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGINT)
                assert self.proc.wait(60) == 0, "".join(self.output)
            poll(lambda: not any(alive(pid) for pid in self.engines), timeout=30,
                 message="every engine process to be gone")
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            for pid in self.engines:
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture
def laps_local(tmp_path):
    stacks: list[LocalStack] = []

    def start(*args: str, timeout: float = 240.0) -> LocalStack:
        stack = LocalStack(list(args), tmp_path / f"local-{len(stacks)}")
        stacks.append(stack)
        return stack.wait_ready(timeout)

    yield start
    for stack in stacks:
        stack.stop()
