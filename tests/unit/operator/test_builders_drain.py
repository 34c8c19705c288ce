"""Graceful shutdown from the CR: every engine and gateway pod gets the grace period as its
terminationGracePeriodSeconds and a preStop delay, and its process a drain deadline (what the
grace period leaves after the delay and the exit) below it; the gateway gets the request
deadline. The rendered flags are checked against the data plane's own parsers."""
from __future__ import annotations

import pytest

from laps_operator.render.builders import build_decode_deployment, build_gateway_deployment, build_prefill_statefulset
from laps_operator.spec.cluster import EXIT_MARGIN_SECONDS, InvalidSpecError, parse_spec
from tests.unit.operator.test_builders import CLUSTER, container, flag, spec_of

WORKLOADS = {"prefill": build_prefill_statefulset, "decode": build_decode_deployment,
             "gateway": build_gateway_deployment}


def _pod(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def _pre_stop(c: dict) -> list[str]:
    return c["lifecycle"]["preStop"]["exec"]["command"]


def _sleeping(seconds: int) -> list[str]:
    # python, not `sleep`: the one program every image here (laps, SGLang) has.
    return ["python3", "-c", f"import time; time.sleep({seconds})"]


@pytest.mark.parametrize("component", sorted(WORKLOADS))
def test_pods_get_the_grace_period_and_a_pre_stop_delay_from_the_cr(component):
    spec = spec_of(drain={"gracePeriodSeconds": 90, "preStopSeconds": 10})
    workload = WORKLOADS[component](CLUSTER, spec)
    assert _pod(workload)["terminationGracePeriodSeconds"] == 90
    c = container(workload)
    assert _pre_stop(c) == _sleeping(10)
    # The process drains for what is left after the delay and its exit.
    assert float(flag(c["args"], "--drain-grace-s")) == 90 - 10 - EXIT_MARGIN_SECONDS


def test_defaults_leave_the_processes_most_of_a_minute():
    spec = spec_of()
    for build in WORKLOADS.values():
        workload = build(CLUSTER, spec)
        assert _pod(workload)["terminationGracePeriodSeconds"] == 60
        c = container(workload)
        assert _pre_stop(c) == _sleeping(5)
        assert float(flag(c["args"], "--drain-grace-s")) == 52
    gateway = container(build_gateway_deployment(CLUSTER, spec))
    assert float(flag(gateway["args"], "--request-deadline-s")) == 600


def test_no_pre_stop_hook_when_the_delay_is_zero():
    spec = spec_of(drain={"gracePeriodSeconds": 20, "preStopSeconds": 0})
    for build in WORKLOADS.values():
        c = container(build(CLUSTER, spec))
        assert "lifecycle" not in c
        assert float(flag(c["args"], "--drain-grace-s")) == 20 - EXIT_MARGIN_SECONDS


def test_sglang_engines_get_the_hook_and_grace_period_but_no_laps_flag():
    spec = spec_of(engine={"backend": "sglang"}, drain={"gracePeriodSeconds": 120})
    workload = build_decode_deployment(CLUSTER, spec)
    assert _pod(workload)["terminationGracePeriodSeconds"] == 120
    c = container(workload)
    assert _pre_stop(c) == _sleeping(5) and "--drain-grace-s" not in c["args"]


def test_a_grace_period_that_leaves_no_time_to_drain_is_invalid():
    with pytest.raises(InvalidSpecError, match=r"spec: drain\.gracePeriodSeconds must be at least "
                                               r"drain\.preStopSeconds \+ 4"):
        parse_spec({"model": {"name": "m", "path": "/m"}, "drain": {"gracePeriodSeconds": 8,
                                                                    "preStopSeconds": 5}})


def test_rendered_drain_and_deadline_flags_are_what_the_processes_accept():
    from laps_agent.engine.cli import build_parser as engine_parser
    from laps_agent.gateway.cli import build_parser as gateway_parser
    from laps_agent.gateway.cli import config_from_args

    spec = spec_of(drain={"gracePeriodSeconds": 45, "preStopSeconds": 2},
                   gateway={"requestDeadlineSeconds": 90.5})
    for build in (build_prefill_statefulset, build_decode_deployment):
        args = engine_parser().parse_args(container(build(CLUSTER, spec))["args"][1:])
        assert args.drain_grace_s == 40
    args = gateway_parser().parse_args(container(build_gateway_deployment(CLUSTER, spec))["args"][1:])
    config = config_from_args(args)
    assert (config.drain_grace_s, config.request_deadline_s) == (40, 90.5)
