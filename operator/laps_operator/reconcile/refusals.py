"""Repairs the API server refuses (a policy added after a cluster was applied, an upgraded
operator's new rendering of an immutable field): said once per cluster and message as a
Warning Event, and in the log at every attempt. Both the update handler's thread and the
resync's report, so the memory of what was said is locked."""
from __future__ import annotations

import logging
import threading
from typing import Any

import kopf

log = logging.getLogger(__name__)


class RepairRefusals:
    def __init__(self) -> None:
        self._said: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def report(self, namespace: str, name: str, refused: str | None, cluster: dict[str, Any] | None) -> None:
        """`refused`: this reconcile's refusals, None when every write went through."""
        key = (namespace, name)
        with self._lock:
            new = refused is not None and self._said.get(key) != refused
            if refused is None:
                self._said.pop(key, None)
            else:
                self._said[key] = refused
        if refused is None:
            return
        log.warning("%s/%s: %s", namespace, name, refused)
        if new and cluster is not None:
            kopf.event(cluster, type="Warning", reason="RepairRefused", message=refused)

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._said.pop((namespace, name), None)
