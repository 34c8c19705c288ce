"""The planner scales real workloads: with `spec.autoscaling` on, the real `laps operator` (the
chart's ServiceAccount) sets the prefill StatefulSet's and the decode Deployment's replicas, the
real controllers make and remove the pods (the scheduler places them on the fake nodes' GPUs, kwok
runs them), a scale-down first takes the StatefulSet's highest ordinals out of routing (labelled
draining) and then lowers the count, which removes exactly those, a decode scale-down removes the
pods holding the fewest requests (the planner's pod-deletion-cost, honoured by the real ReplicaSet
controller), and the GPUs held by the pods that exist never pass the budget at any moment the test
looks.

What this cannot show: the demand comes from a stand-in for the gateway's /metrics (rates the test
sets) and the prefill cost from a stand-in engine, both scraped by a real Prometheus; kwok's pods
run no engine, so nothing drains and nothing is served (the pods' drain is tested with the
engines, tests/integration)."""
from __future__ import annotations

import json

import yaml

from tests.cluster.story import RELEASE, RELEASE_NS, REPO, Story, wait_for
from tests.support.fixtures_prometheus import ScrapeTarget
from tests.support.get_server import GetServer
from tests.support.planner_metrics import PREFILL_COST, Demand, engine_metrics

BUDGET = 6


def test_the_planner_scales_real_statefulsets_within_the_gpu_budget(control_plane, cluster_namespace, programs,
                                                                    prometheus_server):
    ns = cluster_namespace
    story = Story(control_plane, ns, *programs)
    demand = Demand()
    prefill_engine = engine_metrics(PREFILL_COST)
    decode_running = {"now": 40.0}   # what the decode stand-in reports
    decode_engine = GetServer(lambda: ("text/plain; version=0.0.4",
                                       f"laps_engine_running_requests {decode_running['now']}\n".encode()))
    per_pod: list[GetServer] = []
    story.install()
    try:
        prometheus = prometheus_server([ScrapeTarget(demand.http.url, pod="sized-gateway-6b7d9c5f4-x8k2p"),
                                        ScrapeTarget(prefill_engine.url, pod="sized-prefill-0"),
                                        ScrapeTarget(decode_engine.url, pod="sized-decode-7c9d5b6f8-z4m2q")],
                                       namespace=ns, scrape_interval="1s")
        prometheus.wait_targets_up()
        programs[0](control_plane.kubeconfig_for(RELEASE_NS, RELEASE))
        doc = yaml.safe_load((REPO / "examples" / "lapscluster-minimal.yaml").read_text())
        doc["metadata"]["name"] = "sized"
        doc["spec"].update({
            "engine": {"device": "cuda"}, "prefill": {"replicas": 1}, "decode": {"replicas": 1},
            "monitoring": {"prometheusURL": prometheus.url},
            "autoscaling": {"enabled": True, "intervalSeconds": 2, "gpuBudget": BUDGET, "prefill": {"min": 1, "max": 4},
                            "decode": {"min": 1, "max": 4}, "startupSeconds": 0, "scaleDownStabilizationSeconds": 0}})
        control_plane.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(doc))

        gpus_seen: list[int] = []

        def engine_pods(role: str) -> list[dict]:
            return control_plane.kubectl_json("get", "pods", "-n", ns, "-l", f"laps.io/cluster=sized,laps.io/role={role}"
                                              )["items"]

        def held_gpus() -> int:
            """The GPUs the engine pods that exist request (terminating ones too: they hold theirs)."""
            pods = engine_pods("prefill") + engine_pods("decode")
            total = sum(int(c["resources"].get("limits", {}).get("nvidia.com/gpu", 0))
                        for p in pods for c in p["spec"]["containers"])
            gpus_seen.append(total)
            return total

        def ready(role: str) -> list[str]:
            return sorted(p["metadata"]["name"] for p in engine_pods(role)
                          if any(c["type"] == "Ready" and c["status"] == "True"
                                 for c in (p.get("status") or {}).get("conditions") or ())
                          and not p["metadata"].get("deletionTimestamp"))

        wait_for(lambda: held_gpus() and ready("prefill") == ["sized-prefill-0"] and len(ready("decode")) == 1,
                 "one prefill and one decode pod", timeout=60)

        # Demand arrives: the real controllers make the pods the planner asks for.
        demand.set("short", 20.0, 136, 150)
        demand.set("long", 8.0, 1800, 150)
        grown = wait_for(lambda: held_gpus() <= BUDGET and len(ready("prefill")) > 1 and ready("prefill"),
                         "more prefill pods, Ready", timeout=90)
        assert grown[0] == "sized-prefill-0" and all(name.startswith("sized-prefill-") for name in grown)
        auto = control_plane.kubectl_json("get", "laps", "sized", "-n", ns)["status"]["autoscaling"]
        sts = control_plane.kubectl_json("get", "statefulset", "sized-prefill", "-n", ns)
        assert sts["spec"]["replicas"] == auto["desired"]["prefill"] > 1
        assert auto["desired"]["prefill"] + auto["desired"]["decode"] <= BUDGET
        wait_for(lambda: held_gpus() and control_plane.kubectl_json("get", "laps", "sized", "-n", ns)["status"]
                 ["autoscaling"]["actual"]["prefill"] == auto["desired"]["prefill"],
                 "status.autoscaling.actual following the pods", timeout=30)

        # Demand goes: the highest ordinals are taken out of routing first (labelled draining:
        # their group Service no longer selects them), then the StatefulSet removes them; pod 0 stays.
        demand.set("short", 0.0, 136, 150)
        demand.set("long", 0.0, 1800, 150)
        seen_draining: list[tuple[int, list[str]]] = []

        def scaled_down() -> bool:
            pods = engine_pods("prefill")
            replicas = control_plane.kubectl_json("get", "statefulset", "sized-prefill", "-n", ns)["spec"]["replicas"]
            seen_draining.append((replicas, sorted(p["metadata"]["name"] for p in pods
                                                   if p["metadata"]["labels"].get("laps.io/prefill-group") == "draining")))
            return held_gpus() and ready("prefill") == ["sized-prefill-0"] and len(pods) == 1

        wait_for(scaled_down, "back to one prefill pod", timeout=90)
        assert max(gpus_seen) <= BUDGET, gpus_seen
        # Every pod removed was out of routing while the StatefulSet still counted it.
        for pod in grown[1:]:
            ordinal = int(pod.rsplit("-", 1)[1])
            assert any(pod in names and replicas > ordinal for replicas, names in seen_draining), (pod, seen_draining)

        # Decode: four pods, then a scale-down by two lets the two pods holding the fewest requests
        # go (their pod-deletion-cost the lowest: the real ReplicaSet removes those, where by its own
        # ranking it would keep the oldest). Each pod's running requests come from a
        # second Prometheus scraping a stand-in per pod by the names the ReplicaSet gave them,
        # which the cluster is pointed at.
        demand.set("short", 1.0, 136, 150)   # a trickle: one prefill pod serves it; decode is sized on the running
        decode_running["now"] = 80.0
        four = wait_for(lambda: held_gpus() and len(ready("decode")) == 4 and ready("decode"), "four decode pods",
                        timeout=60)
        # The oldest pod among them: the ReplicaSet's own ranking removes the newest first.
        created = {p["metadata"]["name"]: p["metadata"]["creationTimestamp"] for p in engine_pods("decode")}
        oldest = min(four, key=lambda name: (created[name], name))
        idle = {oldest, next(name for name in four if name != oldest)}
        for name in four:
            running = 0.0 if name in idle else 20.0
            per_pod.append(GetServer(lambda r=running: ("text/plain; version=0.0.4",
                                                         f"laps_engine_running_requests {r}\n".encode())))
        second = prometheus_server([ScrapeTarget(demand.http.url, pod="sized-gateway-6b7d9c5f4-x8k2p"),
                                    ScrapeTarget(prefill_engine.url, pod="sized-prefill-0"),
                                    *[ScrapeTarget(server.url, pod=name) for server, name in zip(per_pod, four)]],
                                   namespace=ns, scrape_interval="1s")
        second.wait_targets_up()
        control_plane.kubectl("patch", "laps", "sized", "-n", ns, "--type", "merge", "-p",
                              json.dumps({"spec": {"monitoring": {"prometheusURL": second.url}}}))
        left = wait_for(lambda: held_gpus() and len(engine_pods("decode")) == 2 and ready("decode"),
                        "two decode pods", timeout=60)
        assert set(left) == set(four) - idle, (idle, four, left)
        assert max(gpus_seen) <= BUDGET, gpus_seen

    finally:
        demand.http.close()
        prefill_engine.close()
        decode_engine.close()
        for server in per_pod:
            server.close()
        story.uninstall()
