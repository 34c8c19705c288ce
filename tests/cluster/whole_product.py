"""The whole product on a real control plane, from a LAPSCluster to an OpenAI client's answer:
`helm install` → the chart's operator Deployment runs (its pod's process, with its ServiceAccount)
→ `kubectl apply` of the minimal example → the operator's StatefulSet and Deployments → the
controllers, the scheduler and kwok make the pods Running with IPs → each pod's container runs as
a local process bound to its IP (tests/support/process_kubelet.py: engines on the emulated
backend) → the gateway pod discovers the engines through EndpointSlices → the official `openai`
client asks the gateway pod and gets an answer through prefill and decode.

Run by test_whole_product.py inside a user and network namespace of its own (`unshare -rn`), where
kwok's pod range is routed to loopback: `python -m tests.cluster.whole_product WORKDIR`. Prints
the steps and the answer; exits non-zero with the reason and the pods' logs on failure.
"""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time

import helm_python
import httpx
import yaml

from laps_agent.modelio.model_files import default_model_path
from tests.cluster.story import CHART, RELEASE, RELEASE_NS, REPO, wait_for
from tests.support.controlplane import ControlPlane, build
from tests.support.process_kubelet import ProcessKubelet

POD_RANGE = "10.244.0.0/16"   # kwok's --cidr (tests/support/controlplane.py)
NS = "serving"


def main(workdir: pathlib.Path) -> None:
    for cmd in (["ip", "link", "set", "lo", "up"], ["ip", "route", "add", "local", POD_RANGE, "dev", "lo"]):
        subprocess.run(cmd, check=True)
    began = time.monotonic()

    def step(what: str) -> None:
        print(f"[{time.monotonic() - began:5.1f} s] {what}", flush=True)

    plane = ControlPlane(workdir=workdir / "plane", bin_dir=build())
    kubelet = ProcessKubelet(plane, workdir, default_model_path(), profile="cpu-smollm2")
    try:
        plane.start()
        kubelet.start()
        step(f"control plane up ({plane.startup_s:.1f} s)")
        helm = helm_python.Config(kubeconfig_path=str(plane.kubeconfig), namespace=RELEASE_NS)
        try:
            helm.install(str(CHART), RELEASE, {}, namespace=RELEASE_NS, create_namespace=True)
        finally:
            helm.close()
        wait_for(lambda: any(c.pod.startswith(f"{RELEASE}-") and c.namespace == RELEASE_NS
                             for c in kubelet.running.values()), "the chart's operator pod running", 60)
        step("helm install: the operator pod runs")

        plane.kubectl("create", "namespace", NS)
        plane.kubectl("label", "namespace", NS, "pod-security.kubernetes.io/enforce=restricted")
        doc = yaml.safe_load((REPO / "examples" / "lapscluster-minimal.yaml").read_text())
        plane.kubectl("apply", "-n", NS, "-f", "-", stdin=json.dumps(doc))
        name, served = doc["metadata"]["name"], doc["spec"]["model"]["name"]
        step(f"kubectl apply -f examples/lapscluster-minimal.yaml ({name})")

        def gateway_ip() -> str | None:
            pods = plane.kubectl_json("get", "pods", "-n", NS, "-l", f"laps.io/cluster={name},laps.io/role=gateway")
            ips = [p["status"].get("podIP") for p in pods["items"] if p.get("status", {}).get("podIP")]
            return ips[0] if ips else None
        ip = wait_for(gateway_ip, "the gateway pod's IP", 90)
        url = f"http://{ip}:8000"

        def serving() -> bool:
            status = httpx.get(f"{url}/laps_status", timeout=5).json()
            usable = {g: [p for p in status["groups"][g]["pods"] if p.get("healthy", True)] for g in status["groups"]}
            return all(usable.values()) and httpx.get(f"{url}/health", timeout=5).status_code == 200
        wait_for(serving, "the gateway pod to serve, with engines in every group", 120)
        step(f"the gateway pod at {url} sees its engines: {httpx.get(url + '/laps_status', timeout=5).json()['groups']}")

        import openai

        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        reply = client.chat.completions.create(model=served, max_tokens=8,
                                               messages=[{"role": "user", "content": "Say hello."}])
        step(f"answer: {reply.choices[0].message.content!r} ({reply.usage.completion_tokens} tokens, "
             f"finish {reply.choices[0].finish_reason})")
        assert reply.usage.completion_tokens > 0
    except BaseException:
        print(kubelet.logs(), plane.logs(), sep="\n", file=sys.stderr)
        raise
    finally:
        kubelet.stop()
        plane.stop()


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
