"""The emulator's own tests of Kubernetes semantics (tests/integration/kube_emulator: patches in
their three flavours, PUT, resourceVersion conflicts, the status subresource, generation), run
unchanged against the real API server: where a test passes on both, the emulator
agrees with Kubernetes there. The emulator stays for speed; this keeps it honest.

Not run here: its deletion tests, which assert that the garbage collector and a kubelet act at
once (the emulator's simplification; the real ones act within seconds, test_deletion.py)."""
from __future__ import annotations

from tests.integration.kube_emulator.test_updates import *  # noqa: F403
