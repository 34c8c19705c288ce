"""spec.laps.prefixCache and spec.laps.prefixAffinity: what the engines and the gateway are
started with, and the combination the operator refuses."""
from __future__ import annotations

import pytest
from laps_operator.builders import build_decode_deployment, build_gateway_deployment, build_prefill_statefulset
from laps_operator.naming import ClusterRef
from laps_operator.spec import InvalidSpecError, parse_spec

CLUSTER = ClusterRef("demo", "serving", "0b7c-uid")
BASE = {"model": {"name": "SmolLM2", "path": "/models/smol.gguf"}}
NO_CACHE = {"prefixCache": False, "prefixAffinity": False}


def args_of(workload: dict) -> list[str]:
    return workload["spec"]["template"]["spec"]["containers"][0]["args"]


def engines(spec) -> list[list[str]]:
    return [args_of(build_prefill_statefulset(CLUSTER, spec)), args_of(build_decode_deployment(CLUSTER, spec))]


def test_both_are_on_by_default_and_rendered_explicitly():
    spec = parse_spec(BASE)
    assert (spec.laps.prefix_cache, spec.laps.affinity) == (True, True)
    for args in engines(spec):
        assert "--prefix-cache" in args and "--no-prefix-cache" not in args
    gateway = args_of(build_gateway_deployment(CLUSTER, spec))
    assert "--prefix-affinity" in gateway and "--no-prefix-affinity" not in gateway


def test_off_renders_the_negative_flags_and_parses_with_the_data_plane_parsers():
    from laps_agent.engine.cli import build_parser as engine_parser
    from laps_agent.gateway.cli import build_parser as gateway_parser

    spec = parse_spec({**BASE, "laps": NO_CACHE})
    for args in engines(spec):
        assert "--no-prefix-cache" in args and "--prefix-cache" not in args
        assert engine_parser().parse_args(args[1:]).prefix_cache is False
    gateway = args_of(build_gateway_deployment(CLUSTER, spec))
    assert "--no-prefix-affinity" in gateway and "--prefix-affinity" not in gateway
    assert gateway_parser().parse_args(gateway[1:]).prefix_affinity is False
    on = parse_spec(BASE)
    assert all(engine_parser().parse_args(a[1:]).prefix_cache is True for a in engines(on))
    assert gateway_parser().parse_args(args_of(build_gateway_deployment(CLUSTER, on))[1:]).prefix_affinity is True


def test_the_emulated_engine_reads_the_same_flag():
    # The CRD has no emulated backend, but `engine.extraArgs: [--backend, emulated, ...]` runs
    # one with these args: the same parser, and emulated/build.py models no cache when it is off.
    from laps_agent.engine.cli import build_parser as engine_parser

    prefill = args_of(build_prefill_statefulset(CLUSTER, parse_spec({**BASE, "laps": NO_CACHE})))
    assert engine_parser().parse_args([*prefill[1:], "--backend", "emulated"]).prefix_cache is False


def test_sglang_off_disables_its_radix_cache_on_both_roles_and_passes_no_fork_flag():
    on = parse_spec({**BASE, "engine": {"backend": "sglang"}})
    off = parse_spec({**BASE, "engine": {"backend": "sglang"}, "laps": NO_CACHE})
    for args in engines(on):
        assert "--disable-radix-cache" not in args  # SGLang's default: radix cache on
        assert not [a for a in args if "prefix" in a]
    for args in engines(off):
        assert args.count("--disable-radix-cache") == 1
        assert not [a for a in args if "prefix" in a]  # stock SGLang rejects unknown flags
    # The gateway in front of SGLang takes the same flag as in front of builtin engines.
    assert "--no-prefix-affinity" in args_of(build_gateway_deployment(CLUSTER, off))


def test_affinity_follows_the_cache_unless_set_and_is_refused_without_one():
    # Turning the cache off alone turns affinity off with it.
    alone = parse_spec({**BASE, "laps": {"prefixCache": False}})
    assert "--no-prefix-cache" in engines(alone)[0]
    assert "--no-prefix-affinity" in args_of(build_gateway_deployment(CLUSTER, alone))
    # Asking for affinity without a cache is a contradiction: refused, with the reason.
    with pytest.raises(InvalidSpecError, match=r"laps\.prefixAffinity .* needs laps\.prefixCache"):
        parse_spec({**BASE, "laps": {"prefixCache": False, "prefixAffinity": True}})
    # A cache without affinity is fine: engines still reuse what they happen to hold.
    spec = parse_spec({**BASE, "laps": {"prefixAffinity": False}})
    assert "--prefix-cache" in engines(spec)[0]
    assert "--no-prefix-affinity" in args_of(build_gateway_deployment(CLUSTER, spec))


@pytest.mark.parametrize("field", ["prefixCache", "prefixAffinity"])
def test_non_booleans_are_refused(field):
    with pytest.raises(InvalidSpecError, match=f"spec.laps.{field}"):
        parse_spec({**BASE, "laps": {**NO_CACHE, field: "no"}})
