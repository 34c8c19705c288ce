"""Polling with a deadline: how tests wait for a condition instead of sleeping a fixed time."""
from __future__ import annotations

import time


def poll(condition, timeout: float = 15.0, interval: float = 0.02, message: str = "condition"):
    """Return condition()'s first truthy value, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)  # poll interval, bounded by the deadline above


async def poll_async(condition, timeout: float, message: str, interval: float = 0.02):
    """`poll` for a coroutine condition, inside a test's event loop."""
    import asyncio

    deadline = time.monotonic() + timeout
    while not (value := await condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        await asyncio.sleep(interval)  # poll interval, bounded by the deadline above
    return value


def stop_process(process, sig: int = 15, timeout: float = 15.0) -> None:
    """Ask a child to stop (SIGTERM by default), wait up to `timeout`, then kill it: a test
    never leaves a process behind, even when the child ignores the signal."""
    import subprocess

    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
