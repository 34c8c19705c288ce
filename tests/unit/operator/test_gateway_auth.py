"""The gateway's API keys on Kubernetes: `spec.gateway.apiKeysSecret` becomes a read-only
Secret volume named by `--api-keys-file`; off by default; no RBAC on Secrets."""
from __future__ import annotations

import pytest

from laps_operator.render.builders import build_gateway_deployment, build_gateway_rbac
from laps_operator.spec.cluster import InvalidSpecError, parse_spec
from tests.unit.operator.test_builders import CLUSTER, container, flag, spec_of


def test_no_secret_no_authentication():
    dep = build_gateway_deployment(CLUSTER, spec_of())
    args = container(dep)["args"]
    assert "--api-keys-file" not in args and "--rate-limit-per-key" not in args
    assert not any("secret" in v for v in dep["spec"]["template"]["spec"]["volumes"])


def test_the_secret_is_mounted_read_only_and_named_by_the_flag():
    spec = spec_of(gateway={"apiKeysSecret": {"name": "demo-keys", "key": "keys.txt"},
                            "rateLimitPerKey": 2.5})
    dep = build_gateway_deployment(CLUSTER, spec)
    pod, gw = dep["spec"]["template"]["spec"], container(dep)
    volume = next(v for v in pod["volumes"] if "secret" in v)
    assert volume["secret"]["secretName"] == "demo-keys"
    assert volume["secret"]["items"] == [{"key": "keys.txt", "path": "keys"}]
    mount = next(m for m in gw["volumeMounts"] if m["name"] == volume["name"])
    assert mount["readOnly"] is True
    assert flag(gw["args"], "--api-keys-file") == mount["mountPath"] + "/keys"
    assert flag(gw["args"], "--rate-limit-per-key") == "2.5"
    # The kubelet mounts it: the gateway's Role still reads nothing but discovery objects.
    _, role, _ = build_gateway_rbac(CLUSTER, spec)
    assert not any("secrets" in r["resources"] for r in role["rules"])


def test_the_secret_key_defaults_and_the_rendered_args_parse():
    from laps_agent.gateway.cli import build_parser

    spec = spec_of(gateway={"apiKeysSecret": {"name": "demo-keys"}})
    dep = build_gateway_deployment(CLUSTER, spec)
    volume = next(v for v in dep["spec"]["template"]["spec"]["volumes"] if "secret" in v)
    assert volume["secret"]["items"][0]["key"] == "api-keys"
    args = build_parser().parse_args(container(dep)["args"][1:])
    assert args.api_keys_file.endswith("/keys") and args.rate_limit_per_key == 0.0


def test_a_rate_limit_without_keys_is_refused():
    with pytest.raises(InvalidSpecError, match="apiKeysSecret"):
        parse_spec({"model": {"name": "m", "path": "/m"}, "gateway": {"rateLimitPerKey": 1}})
