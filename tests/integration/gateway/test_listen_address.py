"""Where the gateway listens: a port in use, out of range or a host that does not resolve is one
line naming the address (not a traceback), and `laps local` says so before loading any engine;
an IPv6 host listens and is printed in brackets."""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from laps_agent.serving.listen import ListenError, bind_listening_socket, url_host


@pytest.fixture
def port_in_use():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def _laps(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "laps_agent.cli", *args],
                          capture_output=True, text=True, timeout=60)


def test_unusable_addresses_raise_an_error_naming_them(port_in_use):
    with pytest.raises(ListenError, match=rf"127\.0\.0\.1:{port_in_use}: Address already in use"):
        bind_listening_socket("127.0.0.1", port_in_use)
    with pytest.raises(ListenError, match="the port must be 0-65535"):
        bind_listening_socket("127.0.0.1", 70000)
    with pytest.raises(ListenError, match="nosuch.invalid:0"):
        bind_listening_socket("nosuch.invalid", 0)


def test_laps_local_refuses_a_port_in_use_before_starting_engines(port_in_use):
    result = _laps("local", "--engine", "emulated", "--port", str(port_in_use))
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port_in_use}: Address already in use" in result.stderr
    assert "Traceback" not in result.stderr and "starting" not in result.stdout


def test_laps_gateway_refuses_a_port_in_use(port_in_use):
    result = _laps("gateway", "--host", "127.0.0.1", "--port", str(port_in_use),
                   "--decode", "http://127.0.0.1:1", "--prefill-short", "http://127.0.0.1:2")
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port_in_use}" in result.stderr and "Traceback" not in result.stderr


def test_an_ipv6_host_listens_and_is_written_in_brackets():
    try:
        sock = bind_listening_socket("::1", 0)
    except ListenError as err:  # a kernel without IPv6: nothing of ours to check
        pytest.skip(f"no IPv6 loopback here: {err}")
    with sock:
        assert sock.family == socket.AF_INET6
        port = sock.getsockname()[1]
        assert f"http://{url_host('::1')}:{port}/" == f"http://[::1]:{port}/"
        with socket.create_connection(("::1", port), timeout=10):
            accepted, _ = sock.accept()
            accepted.close()
