"""Why a laps process could not run, where Kubernetes shows it: the container's termination
message. The kubelet creates /dev/termination-log in every container (terminationMessagePath's
default) and copies what the process wrote there into the pod's status
(`lastState.terminated.message`), which `kubectl describe pod` prints and the operator puts in
the LAPSCluster's Ready condition (laps_operator/status/pod_problems.py): "CrashLoopBackOff: Error,
exit code 2: cannot start: /models/m.gguf: no such file or directory" instead of a bare exit code.

Written only where the file already exists (a pod): outside Kubernetes nothing is created."""
from __future__ import annotations

import argparse
import os

# The file; an environment variable so a test (or a pod with another terminationMessagePath) can
# point elsewhere.
PATH_ENV = "LAPS_TERMINATION_LOG"
DEFAULT_PATH = "/dev/termination-log"
# The kubelet reads at most 4096 bytes of it; the head is kept, where the reason is said.
MAX_BYTES = 4096


def record_exit_reason(reason: str) -> None:
    """Leave `reason` (one line, as printed) as this container's termination message."""
    path = os.environ.get(PATH_ENV)
    if path is None:
        if os.getpid() != 1:
            # Only the container's own process (ENTRYPOINT laps: PID 1) speaks for it: a
            # `kubectl exec ... laps bench` failing beside it must not become the pod's reason.
            return
        path = DEFAULT_PATH
    data = reason.strip().encode("utf-8", "replace")[:MAX_BYTES]
    try:
        # No O_CREAT: only the kubelet's file is written, never a new one in /dev.
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NONBLOCK)
    except OSError:
        return
    try:
        os.write(fd, data)
    except OSError:
        pass   # a full or read-only file must not hide the error being reported
    finally:
        os.close(fd)


def record_cannot_start(why: str) -> None:
    """The reason of a process that refused to start, as its error line says it."""
    record_exit_reason(f"cannot start: {why}")


class ExitRecordingParser(argparse.ArgumentParser):
    """An ArgumentParser whose failing exits (`error`: a bad flag, a missing Secret's keys file
    refused at start; `exit(status != 0)`) leave their message as the exit reason too."""

    def exit(self, status: int = 0, message: str | None = None):
        if status:
            said = (message or "").strip()
            record_cannot_start(said.split(": error: ", 1)[-1] or f"exit status {status}")
        super().exit(status, message)
