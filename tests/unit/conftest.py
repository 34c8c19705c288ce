"""The unit tier starts no process and no server: a test here that forks a child or listens on a
socket (itself or through a fixture it sets up) fails, naming what it did. Such a test belongs in
tests/integration."""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest


class StartedSomething(AssertionError):
    pass


_REAL_POPEN_INIT = subprocess.Popen.__init__


def _no_child(self, *args, **kwargs):
    # ctypes.util.find_library runs ldconfig/gcc when a library (torch) is first imported: that is
    # an import, not the test starting something.
    if sys._getframe(1).f_code.co_filename.endswith(("ctypes/util.py", "ctypes\\util.py")):
        return _REAL_POPEN_INIT(self, *args, **kwargs)
    raise StartedSomething("a unit test started a process: move it to tests/integration")


def _no_listen(self, *args, **kwargs):
    raise StartedSomething("a unit test listened on a socket: move it to tests/integration")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    # Before the test's fixtures are set up, so a server fixture it asks for is caught too.
    patch = pytest.MonkeyPatch()
    patch.setattr(subprocess.Popen, "__init__", _no_child)
    patch.setattr(socket.socket, "listen", _no_listen)
    item.stash[_PATCH] = patch
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item):
    yield
    patch = item.stash.get(_PATCH, None)
    if patch is not None:
        patch.undo()


_PATCH = pytest.StashKey[pytest.MonkeyPatch]()
