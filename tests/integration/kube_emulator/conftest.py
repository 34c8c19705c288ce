"""Clients of the emulated API server shared by the emulator's own tests."""
from __future__ import annotations

import kubernetes
import pytest


@pytest.fixture
def core(kube_api):
    return kubernetes.client.CoreV1Api(kube_api.api_client())


@pytest.fixture
def apps(kube_api):
    return kubernetes.client.AppsV1Api(kube_api.api_client())
