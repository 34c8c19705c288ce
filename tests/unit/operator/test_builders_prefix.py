"""spec.laps.prefixCache, spec.laps.prefixAffinity and spec.laps.prefixWarm: what the engines and
the gateway are started with, and the combinations the operator refuses."""
from __future__ import annotations

import pytest

from laps_operator.naming import ClusterRef
from laps_operator.render.builders import build_decode_deployment, build_gateway_deployment, build_prefill_statefulset
from laps_operator.spec.cluster import InvalidSpecError, parse_spec

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


@pytest.mark.parametrize("field", ["prefixCache", "prefixAffinity", "prefixWarm"])
def test_non_booleans_are_refused(field):
    with pytest.raises(InvalidSpecError, match=f"spec.laps.{field}"):
        parse_spec({**BASE, "laps": {**NO_CACHE, field: "no"}})


def warm_flags(args: list[str]) -> list[str]:
    return [a for a in args if a in ("--prefix-warm", "--no-prefix-warm")]


def test_warm_is_on_by_default_on_both_pools_and_the_gateway():
    spec = parse_spec(BASE)
    for args in engines(spec):
        assert warm_flags(args) == ["--prefix-warm"]
    assert warm_flags(args_of(build_gateway_deployment(CLUSTER, spec))) == ["--prefix-warm"]


@pytest.mark.parametrize("laps", [{"prefixWarm": False}, {"prefixAffinity": False}, {"prefixCache": False}],
                         ids=["warm-false", "affinity-false", "cache-false"])
def test_warm_off_or_following_affinity_off_renders_the_negative_flag_everywhere(laps):
    # Unset, warming follows the gateway's affinity: without it the next turn goes elsewhere.
    spec = parse_spec({**BASE, "laps": laps})
    for args in engines(spec):
        assert warm_flags(args) == ["--no-prefix-warm"]
    assert warm_flags(args_of(build_gateway_deployment(CLUSTER, spec))) == ["--no-prefix-warm"]


def test_warm_off_alone_keeps_the_cache_and_affinity():
    spec = parse_spec({**BASE, "laps": {"prefixWarm": False}})
    for args in engines(spec):
        assert "--prefix-cache" in args
    gateway = args_of(build_gateway_deployment(CLUSTER, spec))
    assert "--prefix-affinity" in gateway and warm_flags(gateway) == ["--no-prefix-warm"]


@pytest.mark.parametrize("laps", [{}, {"prefixWarm": False}], ids=["unset", "false"])
def test_sglang_engines_get_no_warm_flag_and_the_gateway_does_not_warm(laps):
    spec = parse_spec({**BASE, "engine": {"backend": "sglang"}, "laps": laps})
    for args in engines(spec):
        assert not [a for a in args if "warm" in a]  # stock SGLang rejects unknown flags
    gateway = args_of(build_gateway_deployment(CLUSTER, spec))
    assert "--prefix-affinity" in gateway  # affinity still works in front of SGLang
    assert warm_flags(gateway) == ["--no-prefix-warm"]


def test_explicit_warm_true_renders_on_and_is_refused_where_it_cannot_work():
    spec = parse_spec({**BASE, "laps": {"prefixWarm": True}})
    assert all(warm_flags(a) == ["--prefix-warm"] for a in engines(spec))
    assert warm_flags(args_of(build_gateway_deployment(CLUSTER, spec))) == ["--prefix-warm"]
    with pytest.raises(InvalidSpecError, match=r"laps\.prefixWarm .*needs engine\.backend builtin: "
                                                r"SGLang has no warm endpoint"):
        parse_spec({**BASE, "engine": {"backend": "sglang"}, "laps": {"prefixWarm": True}})
    for laps in ({"prefixAffinity": False}, {"prefixCache": False}):
        with pytest.raises(InvalidSpecError, match=r"laps\.prefixWarm .* needs laps\.prefixAffinity"):
            parse_spec({**BASE, "laps": {**laps, "prefixWarm": True}})


def test_warm_flags_parse_with_the_data_plane_parsers():
    # Needs laps_agent's --prefix-warm/--no-prefix-warm (engine, emulated engine, gateway).
    from laps_agent.engine.cli import build_parser as engine_parser
    from laps_agent.gateway.cli import build_parser as gateway_parser

    for laps, warm in (({}, True), ({"prefixWarm": False}, False)):
        spec = parse_spec({**BASE, "laps": laps})
        for args in engines(spec):
            assert engine_parser().parse_args(args[1:]).prefix_warm is warm
            assert engine_parser().parse_args([*args[1:], "--backend", "emulated"]).prefix_warm is warm
        gateway = args_of(build_gateway_deployment(CLUSTER, spec))
        assert gateway_parser().parse_args(gateway[1:]).prefix_warm is warm
