"""`laps local` as a child process, the way a user runs it (laps_agent.local.process): the fixture
`laps_local` starts one (start(*args, timeout=...) -> LocalStack, waits for the printed URL) and
stops it at teardown; `LocalStack.stop()` sends Ctrl-C and asserts exit code 0 and that no engine
process is left."""
from __future__ import annotations

from pathlib import Path

import pytest

from laps_agent.local.process import LocalProcess
from tests.support.waiting import poll


class LocalStack(LocalProcess):
    def __init__(self, args: list[str], workdir: Path) -> None:
        super().__init__(list(args), workdir)
        self.workdir = workdir  # engine logs: <workdir>/<engine name>.log

    def stop(self, timeout: float = 60.0) -> int | None:
        try:
            code = super().stop(timeout)
            assert code == 0, "".join(self.output)
            poll(lambda: not self.leftovers(), timeout=30, message="every engine process to be gone")
            return code
        finally:
            self.kill()


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
