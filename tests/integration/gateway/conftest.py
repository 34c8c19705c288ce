from __future__ import annotations

import pytest


@pytest.fixture
def pd_stack(stub_engines, gateway_server):
    """A gateway over stub engines: one short prefill, one long prefill, one decode."""
    from laps_agent.gateway.discovery.membership import StaticDiscovery, StaticSpec
    from tests.support.stub_engine import KVHandoff

    def start(**config):
        handoff = KVHandoff()  # decode answers only after the prefill of the same room
        short, short_engine = stub_engines("prefill", bootstrap_port=9001, handoff=handoff)
        long_, long_engine = stub_engines("prefill", bootstrap_port=9002, handoff=handoff)
        decode, decode_engine = stub_engines("decode", handoff=handoff)
        spec = StaticSpec((short.url,), (long_.url,), (decode.url,))
        config.setdefault("length_threshold", 64)
        config.setdefault("served_model_name", "stub-model")
        gateway = gateway_server(StaticDiscovery(spec, poll_s=0.05), **config)
        return gateway, {"short": short_engine, "long": long_engine, "decode": decode_engine}

    return start
