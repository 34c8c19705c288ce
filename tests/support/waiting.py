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


def wait_for(probe, what: str, timeout: float = 60.0, interval: float = 0.1):
    """Poll `probe` until it returns something truthy, counting an exception as "not yet" (the
    object may not exist yet); fail with `what` and the last value or exception seen."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except Exception as exc:  # the object may not exist yet
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)  # poll interval, bounded by the deadline
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last saw: {last!r}")


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
