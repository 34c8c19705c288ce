"""The loopback ports laps local (and the benchmarks) hand their engines."""
from __future__ import annotations


def test_the_ports_laps_local_hands_its_engines_are_distinct():
    """Chosen one by one and closed at once, the kernel could hand a port out twice: in CI one
    of laps local's 8 prefill engines failed to start on the port another had (Address already
    in use). All are chosen while each is still held."""
    from laps_agent.local.engines import free_ports

    for _ in range(20):
        ports = free_ports(64)
        assert len(set(ports)) == 64 and all(0 < p < 65536 for p in ports)
