"""Builders: every child carries the contract's labels and an owner reference; selectors pick
the right pods; command lines come from the LAPS knobs."""
from __future__ import annotations

import json

import pytest

from laps_operator.naming import ClusterRef
from laps_operator.render.builders import (
    build_children,
    build_config_map,
    build_decode_deployment,
    build_gateway_deployment,
    build_gateway_rbac,
    build_pod_monitor,
    build_prefill_statefulset,
    build_services,
    optional_children,
)
from laps_operator.render.overrides import parse_checked_spec as parse_spec

CLUSTER = ClusterRef("demo", "serving", "0b7c-uid")
BASE = {"model": {"name": "SmolLM2", "path": "/models/smol.gguf", "servedName": "smol"}}


def spec_of(**overrides):
    return parse_spec({**BASE, **overrides})


def container(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]["containers"][0]


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_every_child_has_the_contract_labels_and_an_owner_reference():
    children = build_children(CLUSTER, spec_of(monitoring={"podMonitor": True}))
    kinds = sorted(c["kind"] for c in children)
    assert kinds == sorted(["ConfigMap", "ServiceAccount", "Role", "RoleBinding", "Service", "Service", "Service",
                            "Service", "Service", "StatefulSet", "Deployment", "Deployment", "PodMonitor",
                            "NetworkPolicy", "NetworkPolicy", "NetworkPolicy"])
    for child in children:
        meta = child["metadata"]
        assert meta["namespace"] == "serving"
        labels = meta["labels"]
        assert labels["app.kubernetes.io/name"] == "laps"
        assert labels["app.kubernetes.io/instance"] == "demo"
        assert labels["app.kubernetes.io/managed-by"] == "laps-operator"
        assert labels["laps.io/cluster"] == "demo"
        assert labels["app.kubernetes.io/component"] in {"prefill", "decode", "gateway", "config"}
        assert "laps.io/prefill-group" not in labels
        assert meta["ownerReferences"] == [{
            "apiVersion": "laps.io/v1alpha1", "kind": "LAPSCluster", "name": "demo", "uid": "0b7c-uid",
            "controller": True, "blockOwnerDeletion": True,
        }]


def test_children_names_follow_the_contract():
    names = {(c["kind"], c["metadata"]["name"]) for c in build_children(CLUSTER, spec_of())}
    assert {("Service", n) for n in ("demo-prefill", "demo-prefill-short", "demo-prefill-long",
                                     "demo-decode", "demo-gateway")} <= names
    assert ("StatefulSet", "demo-prefill") in names
    assert ("Deployment", "demo-decode") in names and ("Deployment", "demo-gateway") in names
    assert ("ConfigMap", "demo-config") in names
    assert not any(kind == "PodMonitor" for kind, _ in names)  # off by default
    assert optional_children(CLUSTER, spec_of()) == [("monitoring.coreos.com/v1", "PodMonitor", "demo")]


def test_prefill_statefulset_template_never_holds_the_group_label():
    sts = build_prefill_statefulset(CLUSTER, spec_of(prefill={"replicas": 5}))
    assert sts["spec"]["replicas"] == 5
    assert sts["spec"]["serviceName"] == "demo-prefill"
    assert sts["spec"]["selector"] == {"matchLabels": {"laps.io/cluster": "demo", "laps.io/role": "prefill"}}
    template_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert template_labels["laps.io/role"] == "prefill"
    assert "laps.io/prefill-group" not in template_labels
    # The selector must select the template's pods, or the API server rejects the StatefulSet.
    assert sts["spec"]["selector"]["matchLabels"].items() <= template_labels.items()


def test_prefill_pods_get_podinfo_labels_file_and_downward_env():
    sts = build_prefill_statefulset(CLUSTER, spec_of())
    pod = sts["spec"]["template"]["spec"]
    podinfo = next(v for v in pod["volumes"] if v["name"] == "podinfo")
    assert podinfo["downwardAPI"]["items"] == [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]
    mount = next(m for m in container(sts)["volumeMounts"] if m["name"] == "podinfo")
    assert mount["mountPath"] + "/labels" == flag(container(sts)["args"], "--labels-file") == "/etc/podinfo/labels"
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container(sts)["env"] if "valueFrom" in e}
    assert env == {"POD_IP": "status.podIP", "POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    ports = {p["name"]: p["containerPort"] for p in container(sts)["ports"]}
    assert ports == {"http": 30000, "bootstrap": 8998}


def test_builtin_prefill_args_render_every_laps_knob():
    spec = spec_of(laps={
        "lengthThreshold": 512,
        "scheduler": {"enabled": False, "waitWindowMs": 12.5, "waitMaxBatch": 3, "adaptiveWindow": True,
                      "maxLongWaitMs": 900},
        "batchPrefillGraphs": {"enabled": True, "batchSizes": [8, 1, 4], "seqLengths": [64, 32]},
    }, engine={"device": "cpu", "extraArgs": ["--kv-pages", "512"]})
    c = container(build_prefill_statefulset(CLUSTER, spec))
    args = c["args"]
    assert c["command"] == ["laps"] and args[0] == "engine"
    assert flag(args, "--model") == "/models/smol.gguf"
    assert flag(args, "--served-model-name") == "smol"
    assert flag(args, "--role") == "prefill"
    assert flag(args, "--port") == "30000" and flag(args, "--bootstrap-port") == "8998"
    assert flag(args, "--device") == "cpu"
    assert flag(args, "--length-threshold") == "512"
    assert "--no-laps-scheduler" in args and "--laps-scheduler" not in args
    assert float(flag(args, "--wait-window-ms")) == 12.5
    assert flag(args, "--wait-max-batch") == "3"
    assert "--adaptive-window" in args
    assert float(flag(args, "--max-long-wait-ms")) == 900
    assert "--batch-prefill-graphs" in args
    assert flag(args, "--batch-prefill-graphs-batch-sizes") == "1,4,8"  # sorted for the engine
    assert flag(args, "--batch-prefill-graphs-seq-lengths") == "32,64"
    assert args[-2:] == ["--kv-pages", "512"]


@pytest.mark.parametrize("backend", ["builtin", "sglang"])
def test_the_starvation_bound_follows_the_long_slo_unless_the_cr_sets_it(backend):
    """A long TTFT SLO of 2 s leaves a long prompt kept waiting 2 s no time for its own prefill:
    unset, the engines' bound is 2/3 of the long SLO where that is below 2000 ms."""
    def bound(**fields) -> float:
        spec = spec_of(engine={"backend": backend, "image": "img"}, **fields)
        c = container(build_prefill_statefulset(CLUSTER, spec))
        if backend == "sglang":
            return float(next(e["value"] for e in c["env"] if e["name"] == "LAPS_MAX_LONG_WAIT_MS"))
        return float(flag(c["args"], "--max-long-wait-ms"))

    assert bound() == 2000                                                   # the default 3 s SLO
    assert bound(slo={"ttftP90Seconds": {"long": 2}}) == pytest.approx(1333.3)
    assert bound(slo={"ttftP90Seconds": {"long": 10}}) == 2000               # a looser SLO: the default
    assert bound(slo={"ttftP90Seconds": {"long": 2}}, laps={"scheduler": {"maxLongWaitMs": 900}}) == 900


def test_decode_deployment_renders_decode_role_without_prefill_only_parts():
    dep = build_decode_deployment(CLUSTER, spec_of(decode={"replicas": 3}))
    assert dep["spec"]["replicas"] == 3
    assert dep["spec"]["selector"]["matchLabels"] == {"laps.io/cluster": "demo", "laps.io/role": "decode"}
    args = container(dep)["args"]
    assert flag(args, "--role") == "decode"
    assert "--bootstrap-port" not in args and "--labels-file" not in args
    assert {p["name"] for p in container(dep)["ports"]} == {"http"}
    assert not any(v["name"] == "podinfo" for v in dep["spec"]["template"]["spec"]["volumes"])


def test_sglang_backend_renders_a_stock_launch_server_and_the_plugin_env():
    spec = spec_of(engine={"backend": "sglang", "image": "sglang:laps", "sglang": {"transferBackend": "nixl"},
                           "env": [{"name": "LAPS_BATCH_LOG", "value": "/tmp/batches"}]},
                   prefill={"replicas": 4, "tensorParallelSize": 2},
                   laps={"lengthThreshold": 300, "scheduler": {"waitWindowMs": 10, "waitMaxBatch": 4,
                                                               "maxLongWaitMs": 500}})
    c = container(build_prefill_statefulset(CLUSTER, spec))
    args = c["args"]
    assert c["command"] == ["python3", "-m", "sglang.launch_server"]
    assert flag(args, "--model-path") == "/models/smol.gguf"
    assert flag(args, "--disaggregation-mode") == "prefill"
    assert flag(args, "--disaggregation-transfer-backend") == "nixl"
    assert flag(args, "--disaggregation-bootstrap-port") == "8998"
    assert flag(args, "--tp-size") == "2"
    # Stock SGLang rejects unknown flags: no fork flag may be rendered.
    assert not [a for a in args if "laps" in a or "batch-prefill" in a]
    env = [(e["name"], e.get("value")) for e in c["env"]]
    values = dict(env)
    assert values["LAPS_SCHEDULER"] == "1"
    assert values["LAPS_LENGTH_THRESHOLD"] == "300"
    assert float(values["LAPS_WAIT_WINDOW_MS"]) == 10.0
    assert float(values["LAPS_MAX_LONG_WAIT_MS"]) == 500.0
    assert values["LAPS_WAIT_MAX_BATCH"] == "4"
    # The user's own entries come after the operator's (engine.env may not repeat one of those).
    assert env[-1] == ("LAPS_BATCH_LOG", "/tmp/batches")
    assert any(e["name"] == "SGLANG_HOST_IP" and e["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
               for e in c["env"])
    # A TP-2 engine without an explicit GPU limit asks for two GPUs.
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    decode = container(build_decode_deployment(CLUSTER, spec))
    assert flag(decode["args"], "--disaggregation-mode") == "decode"
    assert "--disaggregation-bootstrap-port" not in decode["args"]
    # Decode pods: the plugin's decode order, by the SLOs the gateway places by.
    laps_env = {e["name"]: e["value"] for e in decode["env"] if e["name"].startswith("LAPS_")}
    assert laps_env == {"LAPS_SCHEDULER": "1", "LAPS_LENGTH_THRESHOLD": "300", "LAPS_SLO": "short=0.5,long=3.0",
                        "LAPS_BATCH_LOG": "/tmp/batches"}


def test_the_plugin_on_a_decode_pod_reads_the_slos_the_gateway_places_by():
    from laps_agent.sglang_plugin.settings import load_settings

    spec = spec_of(engine={"backend": "sglang"}, slo={"ttftP90Seconds": {"short": 0.3, "long": 8}})
    env = {e["name"]: e["value"] for e in container(build_decode_deployment(CLUSTER, spec))["env"]
           if e["name"].startswith("LAPS_")}
    order = load_settings(env).decode_order
    assert order.ttft_slo_s == {"short": 0.3, "long": 8.0} and order.length_threshold == 256
    off = spec_of(engine={"backend": "sglang"}, laps={"scheduler": {"enabled": False}})
    env = {e["name"]: e["value"] for e in container(build_decode_deployment(CLUSTER, off))["env"]
           if e["name"].startswith("LAPS_")}
    assert load_settings(env).decode_order is None   # SGLang's own arrival order


def test_sglang_plugin_env_says_off_when_the_scheduler_is_disabled():
    spec = spec_of(engine={"backend": "sglang"}, laps={"scheduler": {"enabled": False}})
    env = {e["name"]: e.get("value") for e in container(build_prefill_statefulset(CLUSTER, spec))["env"]}
    assert env["LAPS_SCHEDULER"] == "0"
    assert flag(container(build_prefill_statefulset(CLUSTER, spec))["args"],
                "--disaggregation-transfer-backend") == "mooncake"  # the CRD's default


def test_pool_scheduling_fields_and_resources_pass_through():
    pool = {"replicas": 2, "resources": {"limits": {"nvidia.com/gpu": 1, "memory": "8Gi"}, "requests": {"cpu": "2"}},
            "nodeSelector": {"gpu": "h100"}, "tolerations": [{"key": "gpu", "operator": "Exists"}],
            "affinity": {"nodeAffinity": {}}}
    sts = build_prefill_statefulset(CLUSTER, spec_of(prefill=pool, engine={"device": "cuda"}))
    pod = sts["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"gpu": "h100"}
    assert pod["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert pod["affinity"] == {"nodeAffinity": {}}
    # Quantities come out as strings, the API's own form.
    assert container(sts)["resources"] == {"limits": {"nvidia.com/gpu": "1", "memory": "8Gi"}, "requests": {"cpu": "2"}}


def test_group_services_select_prefill_pods_by_group_label():
    services = {s["metadata"]["name"]: s for s in build_services(CLUSTER, spec_of(gateway={"port": 9000,
                                                                                     "serviceType": "NodePort"}))}
    for group in ("short", "long"):
        svc = services[f"demo-prefill-{group}"]
        assert svc["spec"]["selector"] == {"laps.io/cluster": "demo", "laps.io/role": "prefill",
                                           "laps.io/prefill-group": group}
        assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"http": 30000, "bootstrap": 8998}
    headless = services["demo-prefill"]
    assert headless["spec"]["clusterIP"] == "None"
    assert "laps.io/prefill-group" not in headless["spec"]["selector"]
    assert services["demo-decode"]["spec"]["selector"] == {"laps.io/cluster": "demo", "laps.io/role": "decode"}
    gateway = services["demo-gateway"]["spec"]
    assert gateway["type"] == "NodePort" and gateway["ports"][0]["port"] == 9000


def test_gateway_discovers_the_group_services_with_its_own_service_account():
    spec = spec_of(laps={"lengthThreshold": 128}, gateway={"replicas": 2, "port": 9000})
    dep = build_gateway_deployment(CLUSTER, spec)
    args = container(dep)["args"]
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "demo-gateway"
    assert args[0] == "gateway"
    assert flag(args, "--discovery") == "kubernetes"
    assert flag(args, "--namespace") == "serving"
    assert flag(args, "--prefill-short-service") == "demo-prefill-short"
    assert flag(args, "--prefill-long-service") == "demo-prefill-long"
    assert flag(args, "--decode-service") == "demo-decode"
    assert flag(args, "--length-threshold") == "128"
    assert flag(args, "--served-model-name") == "smol"
    # The container listens where its `http` port says; the Service maps gateway.port onto it.
    assert container(dep)["ports"][0]["name"] == "http"
    assert flag(args, "--port") == str(container(dep)["ports"][0]["containerPort"])
    assert flag(args, "--tokenizer") == "/models/smol.gguf"  # same image as the builtin engines


def test_gateway_without_access_to_the_model_falls_back_to_the_heuristic():
    spec = spec_of(engine={"backend": "sglang", "image": "sglang:laps"})
    assert "--tokenizer" not in container(build_gateway_deployment(CLUSTER, spec))["args"]
    with_volume = spec_of(engine={"backend": "sglang", "image": "sglang:laps"},
                          model={**BASE["model"], "volume": {"persistentVolumeClaim": {"claimName": "w"}}})
    dep = build_gateway_deployment(CLUSTER, with_volume)
    assert flag(container(dep)["args"], "--tokenizer") == "/models/smol.gguf"
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "w"}} in dep["spec"]["template"]["spec"]["volumes"]


def test_gateway_role_may_read_endpointslices_only():
    sa, role, binding = build_gateway_rbac(CLUSTER, spec_of())
    assert sa["kind"] == "ServiceAccount" and sa["metadata"]["name"] == "demo-gateway"
    assert role["rules"] == [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                              "verbs": ["list", "watch"]}]
    assert binding["roleRef"]["name"] == "demo-gateway"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "demo-gateway", "namespace": "serving"}]


def test_config_map_holds_the_effective_laps_config():
    cm = build_config_map(CLUSTER, spec_of(laps={"allocation": {"enabled": True, "ratio": 3}}))
    config = json.loads(cm["data"]["laps.json"])
    assert config["laps"]["lengthThreshold"] == 256
    assert config["laps"]["allocation"] == {"enabled": True, "intervalSeconds": 5.0, "ratio": 3.0, "minPerGroup": 1,
                                            "cooldownSeconds": 60.0, "confirmIntervals": 2}
    assert config["services"]["prefillShort"] == "demo-prefill-short"
    assert config["monitoring"]["prometheusURL"] == ""


def test_pod_monitor_scrapes_every_pod_of_the_cluster():
    pm = build_pod_monitor(CLUSTER, spec_of(monitoring={"podMonitor": True}))
    assert pm["spec"]["selector"] == {"matchLabels": {"laps.io/cluster": "demo"}}
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "http"
    assert "laps.io/prefill-group" in pm["spec"]["podTargetLabels"]


@pytest.mark.parametrize("env", [[{"name": "A", "value": "1"}],
                                 [{"name": "B", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]])
def test_user_env_is_appended_after_the_downward_env(env):
    c = container(build_prefill_statefulset(CLUSTER, spec_of(engine={"env": env})))
    assert c["env"][-1] == env[0]


def test_rendered_builtin_engine_args_are_what_laps_engine_accepts():
    # The contract check against the real command-line parsers of the data plane.
    from laps_agent.engine.cli import build_parser as engine_parser

    spec = spec_of(laps={"lengthThreshold": 384, "scheduler": {"enabled": False, "waitWindowMs": 7.5,
                                                                "adaptiveWindow": True},
                         "batchPrefillGraphs": {"batchSizes": [1, 2], "seqLengths": [32, 64]}},
                   engine={"device": "cpu"})
    prefill = engine_parser().parse_args(container(build_prefill_statefulset(CLUSTER, spec))["args"][1:])
    assert (prefill.role, prefill.model, prefill.served_model_name) == ("prefill", "/models/smol.gguf", "smol")
    assert (prefill.length_threshold, prefill.laps_scheduler, prefill.wait_window_ms) == (384, False, 7.5)
    assert prefill.adaptive_window is True and prefill.batch_prefill_graphs is True
    assert prefill.batch_prefill_graphs_batch_sizes == [1, 2] and prefill.batch_prefill_graphs_seq_lengths == [32, 64]
    assert prefill.labels_file == "/etc/podinfo/labels" and prefill.bootstrap_port == 8998
    assert prefill.prefix_cache is True  # laps.prefixCache's default (tests: test_builders_prefix.py)
    decode = engine_parser().parse_args(container(build_decode_deployment(CLUSTER, spec))["args"][1:])
    assert decode.role == "decode" and decode.device == "cpu"
    assert prefill.max_queued_requests is None and decode.max_queued_requests is None  # engine default
    # Decode admission follows the same scheduler switch (off here: arrival order, no deadline).
    assert decode.laps_scheduler is False


def test_decode_engines_order_admission_by_the_slos_the_gateway_places_by():
    from laps_agent.engine.cli import build_parser as engine_parser
    from laps_agent.engine.flags import decode_order

    spec = spec_of(slo={"ttftP90Seconds": {"short": 0.3, "long": 8}}, laps={"lengthThreshold": 384})
    decode = engine_parser().parse_args(container(build_decode_deployment(CLUSTER, spec))["args"][1:])
    order = decode_order(decode)
    assert order.ttft_slo_s == {"short": 0.3, "long": 8.0} and order.length_threshold == 384


def test_the_engine_queue_bound_comes_from_the_cr():
    from laps_agent.engine.cli import build_parser as engine_parser

    spec = spec_of(engine={"maxQueuedRequests": 64})
    for build in (build_prefill_statefulset, build_decode_deployment):
        args = engine_parser().parse_args(container(build(CLUSTER, spec))["args"][1:])
        assert args.max_queued_requests == 64
    with pytest.raises(ValueError, match="maxQueuedRequests"):
        spec_of(engine={"maxQueuedRequests": -1})


def test_rendered_gateway_args_are_what_laps_gateway_accepts():
    from laps_agent.gateway.cli import build_parser as gateway_parser

    args = gateway_parser().parse_args(container(build_gateway_deployment(CLUSTER, spec_of()))["args"][1:])
    assert args.discovery == "kubernetes" and args.namespace == "serving"
    assert (args.prefill_short_service, args.prefill_long_service, args.decode_service) == (
        "demo-prefill-short", "demo-prefill-long", "demo-decode")
    assert args.served_model_name == "smol" and args.length_threshold == 256 and args.port == 8000
    assert args.prefix_affinity is True  # laps.prefixAffinity's default


def test_the_gateways_admission_bounds_come_from_the_cr_or_its_own_defaults():
    from laps_agent.gateway.cli import build_parser as gateway_parser
    from laps_agent.gateway.config import GatewayConfig

    def parsed(**gateway):
        return gateway_parser().parse_args(
            container(build_gateway_deployment(CLUSTER, spec_of(gateway=gateway)))["args"][1:])

    unset = parsed()
    assert unset.max_pending_tokens_per_pod == GatewayConfig.max_pending_tokens_per_pod
    assert unset.max_decode_share == GatewayConfig.max_decode_share
    given = parsed(maxPendingTokensPerPod=4096, maxDecodeShare=0.5)
    assert given.max_pending_tokens_per_pod == 4096 and given.max_decode_share == 0.5
    off = parsed(maxPendingTokensPerPod=0, maxDecodeShare=0)
    assert off.max_pending_tokens_per_pod == 0 and off.max_decode_share == 0.0


def test_the_gateway_places_by_the_slos_the_planner_sizes_for():
    from laps_agent.gateway.cli import build_parser as gateway_parser
    from laps_agent.gateway.cli import config_from_args
    from laps_agent.policy.slo import ttft_slos

    def config(**spec):
        rendered = container(build_gateway_deployment(CLUSTER, spec_of(**spec)))["args"][1:]
        return config_from_args(gateway_parser().parse_args(rendered))

    assert config().ttft_slo_s == ttft_slos()
    assert config(slo={"ttftP90Seconds": {"short": 0.3, "long": 8}}).ttft_slo_s == {"short": 0.3, "long": 8.0}


def test_gateway_is_ready_on_health_and_alive_on_live():
    c = container(build_gateway_deployment(CLUSTER, spec_of()))
    # /health: 200 once it can route, 503 before (out of the Service, not restarted);
    # /live: 200 while the process serves (only a hung gateway is restarted).
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/live", "port": "http"}
    assert c["livenessProbe"]["failureThreshold"] * c["livenessProbe"]["periodSeconds"] >= 30
    assert c["ports"][0]["name"] == "http"


@pytest.mark.parametrize(("allocation", "interval"), [
    ({}, "15s"),                                                   # loop off: the usual 15 s
    ({"enabled": True, "intervalSeconds": 5}, "2500ms"),           # twice per interval
    ({"enabled": True, "intervalSeconds": 1}, "1s"),               # at most once a second
    ({"enabled": True, "intervalSeconds": 120}, "15s"),            # at least every 15 s
])
def test_pod_monitor_scrapes_at_least_twice_per_allocation_interval(allocation, interval):
    pm = build_pod_monitor(CLUSTER, spec_of(monitoring={"podMonitor": True}, prefill={"replicas": 2},
                                            laps={"allocation": allocation}))
    assert pm["spec"]["podMetricsEndpoints"][0]["interval"] == interval


def test_sglang_prefill_gets_sglang_s_own_full_prefill_graphs_for_the_bucket_grid():
    spec = spec_of(engine={"backend": "sglang", "device": "cuda"},
                   laps={"batchPrefillGraphs": {"batchSizes": [1, 4], "seqLengths": [64, 128]}})
    args = container(build_prefill_statefulset(CLUSTER, spec))["args"]
    config = json.loads(flag(args, "--cuda-graph-config"))
    assert config == {"prefill": {"backend": "full", "bs": [64, 128, 256, 512], "full_prefill_max_req": 4}}
    assert "--cuda-graph-config" not in container(build_decode_deployment(CLUSTER, spec))["args"]
    off = spec_of(engine={"backend": "sglang", "device": "cuda"}, laps={"batchPrefillGraphs": {"enabled": False}})
    assert "--cuda-graph-config" not in container(build_prefill_statefulset(CLUSTER, off))["args"]


def test_a_model_volume_copied_with_its_own_name_is_still_the_one_mounted():
    # A Volume pasted from a pod spec carries `name`; the engines mount the volume named "model".
    spec = spec_of(model={**BASE["model"], "volume": {"name": "weights", "persistentVolumeClaim": {"claimName": "w"}}})
    for workload in (build_prefill_statefulset(CLUSTER, spec), build_decode_deployment(CLUSTER, spec)):
        pod = workload["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mount = next(m for m in container(workload)["volumeMounts"] if m["mountPath"] == "/models")
        assert volumes[mount["name"]] == {"name": "model", "persistentVolumeClaim": {"claimName": "w"}}
